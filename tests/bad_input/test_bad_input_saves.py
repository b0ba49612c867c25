"""Saving is all or nothing and fails with one `ld.SaveError` naming the path; loading a saved
model checks the sizes its config declares against the weights file before allocating."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import labdist as ld
from labdist.training.checkpoint_files import CheckpointError


def model():
    with ld.get_strategy().scope():
        m = ld.models.Sequential([ld.layers.Dense(4, activation="relu", input_shape=(3,)),
                                  ld.layers.Dense(2, activation="softmax")], seed=2)
        m.compile(loss="sparse_categorical_crossentropy", optimizer="sgd")
    return m


def listing(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None)
            for p in sorted(root.rglob("*"))}


# -- 5. half-done saves ---------------------------------------------------------------------
def test_save_where_config_json_is_a_folder_writes_nothing(tmp_path):
    """Before: weights.npz was written, then config.json failed."""
    (tmp_path / "m" / "config.json").mkdir(parents=True)
    before = listing(tmp_path)
    with pytest.raises(ld.SaveError) as info:
        model().save(tmp_path / "m")
    text = str(info.value)
    assert f"model.save({str(tmp_path / 'm')!r}): cannot write" in text, text
    assert str(tmp_path / "m" / "config.json") in text and "allowed:" in text, text
    assert isinstance(info.value, OSError)
    assert listing(tmp_path) == before  # no weights.npz, no temp file


def test_a_failed_save_keeps_the_previous_save_whole(tmp_path):
    m = model()
    m.save(tmp_path / "m")
    before = listing(tmp_path)
    (tmp_path / "m" / "weights.npz").unlink()
    (tmp_path / "m" / "weights.npz").mkdir()  # now the weights cannot be replaced
    with pytest.raises(ld.SaveError, match="weights.npz"):
        m.save(tmp_path / "m")
    assert (tmp_path / "m" / "config.json").read_bytes() == before["m/config.json"]
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["config.json", "weights.npz"]


@pytest.mark.parametrize("call", ["save", "save_weights", "checkpoint"])
def test_an_unwritable_path_is_one_save_error_naming_it(tmp_path, call):
    """A file where a folder is needed: NotADirectoryError (PermissionError goes the same
    way; these tests run as root, where permissions do not bind)."""
    (tmp_path / "file").write_text("x")
    target = tmp_path / "file" / ("w.npz" if call == "save_weights" else "out")
    m = model()
    before = listing(tmp_path)
    with pytest.raises(ld.SaveError) as info:
        if call == "checkpoint":
            ld.train.Checkpoint(model=m).save(target)
        else:
            getattr(m, call)(target)
    text = str(info.value)
    assert str(tmp_path / "file") in text and "cannot write" in text, text
    assert "allowed: a path in a folder you can write to" in text, text
    assert listing(tmp_path) == before


def test_checkpoint_save_where_the_index_is_a_folder_writes_nothing(tmp_path):
    (tmp_path / "ckpt" / "checkpoint").mkdir(parents=True)
    before = listing(tmp_path)
    with pytest.raises(ld.SaveError, match=r"Checkpoint.save\(.*\): cannot write .*checkpoint"):
        ld.train.Checkpoint(model=model()).save(tmp_path / "ckpt")
    assert listing(tmp_path) == before  # no ckpt-0.npz left without an index


# -- 4. saved models are not trusted for their sizes ------------------------------------------
def test_load_model_checks_declared_sizes_before_allocating(tmp_path):
    """Before: a config saying Dense(units=10**9) started allocating a 22 GiB kernel."""
    m = model()
    m.save(tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    config["layers"][1]["config"]["units"] = 10**9
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointError) as info:
            ld.models.load_model(tmp_path / "m")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    text = str(info.value)
    assert "layer 1 (Dense(1000000000" in text, text
    assert "declares weight/dense_1/kernel of shape (4, 1000000000)" in text, text
    assert "weights.npz holds (4, 2)" in text, text
    assert peak < 50 * 2**20, peak


def test_load_model_refuses_weights_missing_from_the_file(tmp_path):
    m = model()
    m.save(tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    config["layers"].append({"class_name": "Dense", "config": {"units": 3, "activation": None,
                                                                "use_bias": True,
                                                                "input_shape": None}})
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"layer 2 .* declares weight/dense_2/kernel of "
                                              r"shape \(2, 3\), but weights.npz holds no such"):
        ld.models.load_model(tmp_path / "m")


def test_a_saved_model_still_loads(tmp_path):
    m = model()
    m.save(tmp_path / "m")
    again = ld.models.load_model(tmp_path / "m")
    for a, b in zip(m.get_weights(), again.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
