"""Training: the run from start to record (trainer.py), its model, step, callbacks, checkpoints,
agreed stops, exact validation, throughput, Horovod Elastic, and evaluate and predict."""
