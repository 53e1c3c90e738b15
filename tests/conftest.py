"""Loaded by pytest before any test module: hvd_train first, as `python -m hvd_train` has it.

On TensorFlow 2.16+ `import hvd_train` sets TF_USE_LEGACY_KERAS=1, which TensorFlow reads when
it is imported: tf.keras and the module path `tensorflow.keras.*` are then Keras 2 (tf_keras).
A test module that imported TensorFlow first would leave `tensorflow.keras.*` as Keras 3 for
the whole test process (the first `import tensorflow.keras.callbacks` even rebinds tf.keras),
which no trainer process ever sees.
"""

import hvd_train  # noqa: F401
