"""The run: `train()` from start to record (trainer.py), its banner, where it resumes, what it
tracks, how it fits (fitting.py, elastic.py) and how it ends (outcome.py, failure.py), with the
state it carries to every ending (state.py)."""
