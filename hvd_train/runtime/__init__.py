"""A worker's runtime: Horovod's state (ranks, collectives, devices), the speed knobs, and the
Keras binding: everything that depends on which Keras trains sits behind one module per Keras."""
