"""Using a trained model: `hvd-train evaluate` and `hvd-train predict`; and `hvd-train
data-bench`, the input pipeline and the training step timed alone."""
