"""Small datasets in Keras' `load_data()` shape: digits (offline, inside scikit-learn), MNIST
(downloaded once and cached; fails fast and clearly offline), and synthetic data."""

from __future__ import annotations

import os
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np

from labdist import checks

MNIST_URL = "https://storage.googleapis.com/tensorflow/tf-keras-datasets/mnist.npz"
MNIST_KEYS = ("x_train", "y_train", "x_test", "y_test")


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


class mnist:
    """MNIST as Keras ships it (uint8 28x28 images), cached under $LABDIST_DATA or
    ~/.labdist/datasets."""

    @staticmethod
    def load_data(path: str | os.PathLike | None = None, url: str | None = None,
                  timeout: float = 10.0):
        """((x_train, y_train), (x_test, y_test)). `path`: an mnist.npz to use (else the
        cache, downloading it there on first use)."""
        checks.positive("timeout", timeout, unit="seconds")
        target = Path(path) if path is not None else _cache_dir() / "mnist.npz"
        if not target.exists():
            if path is not None:
                raise FileNotFoundError(f"path={str(path)!r} does not exist")
            _download(url or MNIST_URL, target, timeout)
        with np.load(target, allow_pickle=False) as data:
            missing = [k for k in MNIST_KEYS if k not in data.files]
            if missing:
                raise ValueError(f"{str(target)!r} is not an MNIST file: missing {missing}")
            x_train, y_train, x_test, y_test = (data[k] for k in MNIST_KEYS)
        return (x_train, y_train), (x_test, y_test)


def _cache_dir() -> Path:
    return Path(os.environ.get("LABDIST_DATA", Path.home() / ".labdist" / "datasets"))


def _download(url: str, target: Path, timeout: float) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            payload = response.read()
    except (urllib.error.URLError, OSError) as e:
        raise ConnectionError(
            f"could not download MNIST from {url} ({getattr(e, 'reason', e)}); this machine "
            f"may be offline. Put mnist.npz at {str(target)!r} (or pass path=), or use "
            "ld.datasets.digits, which works offline.") from None
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".mnist.")
    with os.fdopen(fd, "wb") as f:
        f.write(payload)
    os.replace(tmp, target)  # atomic: a half-written download is never taken for the data


class synthetic:
    """Generated data whose replicas' shards can differ (non-identically distributed), for
    drift experiments: with `skew > 0`, replica r's part of every global batch comes from
    inputs shifted by `r * skew`. Keep the layout by fitting with `shuffle=False` and the same
    `global_batch_size`."""

    @staticmethod
    def regression(n_samples: int = 1024, n_features: int = 4, noise: float = 0.1,
                   num_replicas: int = 1, global_batch_size: int = 64, skew: float = 0.0,
                   seed: int = 0):
        """(x, y) with y = x @ w + b + noise (the true w, b are fixed by `seed`)."""
        checks.number("noise", noise, 0.0)
        rng = np.random.default_rng(seed)
        w, b = rng.normal(size=n_features), rng.normal()
        x = _skewed_inputs(rng, n_samples, n_features, num_replicas, global_batch_size, skew)
        y = x @ w + b + rng.normal(0, noise, n_samples)
        return x.astype(np.float32), y.astype(np.float32)

    @staticmethod
    def classification(n_samples: int = 1024, n_features: int = 4, n_classes: int = 3,
                       num_replicas: int = 1, global_batch_size: int = 64, skew: float = 0.0,
                       seed: int = 0):
        """(x, y) with labels from a fixed random linear map of x (argmax over classes)."""
        rng = np.random.default_rng(seed)
        w = rng.normal(size=(n_features, n_classes))
        x = _skewed_inputs(rng, n_samples, n_features, num_replicas, global_batch_size, skew)
        return x.astype(np.float32), (x @ w).argmax(axis=1).astype(np.int64)


def _skewed_inputs(rng, n, d, num_replicas, global_batch_size, skew):
    from labdist.data.distributed import split_sizes

    for name, value in (("n_samples", n), ("n_features", d), ("num_replicas", num_replicas),
                        ("global_batch_size", global_batch_size)):
        checks.integer(name, value, 1)
    checks.number("skew", skew)
    checks.array_bytes("the data set", (n, d), 8)
    x = rng.normal(size=(n, d))
    if skew:
        for start in range(0, n, global_batch_size):
            size = min(global_batch_size, n - start)
            offset = start
            for r, k in enumerate(split_sizes(size, num_replicas)):
                x[offset:offset + k] += r * skew
                offset += k
    return x
