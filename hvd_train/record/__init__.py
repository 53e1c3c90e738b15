"""A run's record: the run directory and its layout, summary.json, the keeper, the stops.
Standard library only: rank 0 writes the record before TensorFlow loads, and the launchers
read it without TensorFlow."""
