"""The 1,797 8x8 handwritten digits of `data.source: digits`, shipped with hvd_train.

digits.csv.gz, beside this module, is the test set of the UCI "Optical Recognition of
Handwritten Digits" data (E. Alpaydin and C. Kaynak, 1998; https://archive.ics.uci.edu/dataset/80,
CC BY 4.0), byte for byte the file scikit-learn ships for its `load_digits`: one row per image,
its 64 pixel counts (0 to 16, row by row) then its label. hvd_train reads it itself rather than
depending on scikit-learn: Keras 3 imports an installed scikit-learn (with SciPy) at its own
import, which would lengthen every worker's start-up (docs/benchmarks.md, "Start-up").
"""

from __future__ import annotations

import gzip
import os

import numpy as np

PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "digits.csv.gz")


def load() -> tuple[np.ndarray, np.ndarray]:
    """The images, (1797, 8, 8) float64 in [0, 16], and their labels, (1797,) int64 in 0-9: the
    arrays of scikit-learn's `load_digits().images` and `.target`."""
    with gzip.open(PATH, "rt", encoding="utf-8") as f:
        data = np.loadtxt(f, delimiter=",")
    return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(np.int64)
