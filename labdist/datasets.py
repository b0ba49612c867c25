"""Small datasets that work offline, in Keras' `load_data()` shape."""

from __future__ import annotations

import numpy as np


class digits:
    """scikit-learn's 8x8 handwritten digits (1797 images, shipped inside scikit-learn)."""

    @staticmethod
    def load_data(test_split: float = 0.2, seed: int = 0):
        """((x_train, y_train), (x_test, y_test)); x as float32 in [0, 1], 64 features."""
        if not 0 < test_split < 1:
            raise ValueError(f"test_split={test_split!r} must be in (0, 1)")
        try:
            from sklearn.datasets import load_digits
        except ImportError:
            raise ImportError("the digits data ships with scikit-learn: "
                              "pip install 'labdist[datasets]'") from None
        data = load_digits()
        x = (data.data / 16.0).astype(np.float32)
        y = data.target.astype(np.int64)
        order = np.random.default_rng(seed).permutation(len(x))
        cut = int(len(x) * (1 - test_split))
        train, test = order[:cut], order[cut:]
        return (x[train], y[train]), (x[test], y[test])
