"""Starting jobs: the horovodrun command, `hvd-train launch` and its supervisor, Slurm, sweeps,
the scaling plan. Imports no TensorFlow, Horovod or Keras (a test holds it to that)."""
