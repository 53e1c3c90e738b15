"""Training: the model (models.py), its compiled step (step.py), its checkpoints (checkpoint.py)
and exact validation (evaluation.py); hvd_train's callbacks, agreed stops among them
(callbacks/); the run from start to record (run/); and evaluate, predict and data-bench
(inference/)."""
