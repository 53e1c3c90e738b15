"""hvd_train's own callbacks, one module each, on the base class of base.py; callback_list.py
builds them all and fixes the one order they run in, as Keras' callback_list.py does."""
