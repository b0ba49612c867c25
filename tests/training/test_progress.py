"""Progress of fit/evaluate/predict: a text bar in a terminal, an ipywidgets bar in a notebook
(checked in a real kernel through nbclient), nothing with verbose=0."""

import nbformat
import numpy as np
import pytest
from nbclient import NotebookClient

import labdist as ld
from labdist.training.progress import ProgressBar, check_verbose

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


def _model():
    model = ld.models.Sequential([ld.layers.Dense(4, activation="relu", input_shape=(3,)),
                                  ld.layers.Dense(2, activation="softmax")])
    model.compile(loss="sparse_categorical_crossentropy", optimizer=ld.optimizers.SGD(0.1),
                  metrics=["accuracy"])
    return model


def _data(n=40):
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, 3)).astype(np.float32), rng.integers(0, 2, size=n)


def test_terminal_bar_counts_steps_and_closes_each_epoch(capsys):
    x, y = _data()
    _model().fit(x, y, batch_size=10, epochs=2, verbose=1)
    out = capsys.readouterr().out
    assert "Epoch 1/2 4/4 [" in out and "Epoch 2/2 4/4 [" in out  # the bar reached its end
    assert out.count("\n") == 2  # one closing line per epoch, the bar redrawn in place
    closing = out.split("\r")[-1]
    assert closing.startswith("Epoch 2/2 - ") and "loss: " in closing and "accuracy: " in closing


def test_verbose_2_prints_only_epoch_lines_and_0_nothing(capsys):
    x, y = _data()
    model = _model()
    model.fit(x, y, batch_size=10, epochs=2, verbose=2)
    out = capsys.readouterr().out
    assert "[" not in out and out.count("Epoch ") == 2
    model.fit(x, y, batch_size=10, epochs=2, verbose=0)
    model.evaluate(x, y, verbose=0)
    model.predict(x, verbose=0)
    assert capsys.readouterr().out == ""


def test_evaluate_and_predict_show_progress(capsys):
    x, y = _data()
    model = _model()
    loss, accuracy = model.evaluate(x, y, batch_size=10, verbose=1)
    out = capsys.readouterr().out
    assert f"loss: {loss:.4f}" in out and f"accuracy: {accuracy:.4f}" in out
    assert "Evaluate 4/4" in out
    model.predict(x, batch_size=10)
    assert "Predict 4/4" in capsys.readouterr().out


@pytest.mark.parametrize("bad", [3, -1, "loud", 1.5, None])
def test_bad_verbose_is_refused_before_training(bad):
    x, y = _data()
    model = _model()
    before = model.get_weights()
    with pytest.raises(ValueError, match=r"verbose: got .*expected 'auto', 0, 1 or 2"):
        model.fit(x, y, epochs=1, verbose=bad)
    for a, b in zip(before, model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_check_verbose_maps_keras_values():
    assert [check_verbose(v) for v in ("auto", True, False, 0, 1, 2)] == [1, 1, 0, 0, 1, 2]


def test_bar_redraws_at_most_20_times_a_second(capsys):
    bar = ProgressBar("Epoch 1/1", 1000, verbose=1, widget=False)
    for done in range(1, 1001):
        bar.update(done, {"loss": 0.5})
    out = capsys.readouterr().out
    assert 1 <= out.count("\r") < 50  # a tight loop draws a handful of frames, plus the last
    assert out.endswith("1000/1000 [========================] loss: 0.5000")


def test_the_end_is_drawn_once_whoever_reports_it(capsys):
    """fit's watch thread may draw the last count before the span's own report of it: a
    console (or a log) got "70/70" twice in one epoch (the multi-worker tutorial's port)."""
    bar = ProgressBar("Epoch 1/3", 70, verbose=1, widget=False)
    bar.update(45, {"loss": 0.7})
    bar.update(70, {"loss": 0.5})  # the watch, from the board's rows
    bar.update(70, {"loss": 0.5})  # the span's return, the same rows
    bar.finish({"loss": 0.5})
    out = capsys.readouterr().out
    assert out.count("70/70") == 1 and out.count("45/70") == 1
    assert out.endswith("\rEpoch 1/3 - 0.0s - loss: 0.5000\n")


def test_notebook_fit_shows_a_widget_not_text():
    """In a real kernel, fit displays an ipywidgets progress bar that ends full and green."""
    code = "\n".join([
        "import numpy as np, labdist as ld",
        "rng = np.random.default_rng(0)",
        "x = rng.normal(size=(40, 3)).astype('float32'); y = rng.integers(0, 2, size=40)",
        "m = ld.models.Sequential([ld.layers.Dense(2, activation='softmax', input_shape=(3,))])",
        "m.compile(loss='sparse_categorical_crossentropy', optimizer='sgd')",
        "h = m.fit(x, y, batch_size=10, epochs=2)",
        "bars = [w for w in __import__('ipywidgets').Widget.widgets.values()",
        "        if type(w).__name__ == 'IntProgress']",
        "print([(b.value, b.max, b.bar_style) for b in bars])",
    ])
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    outputs = nb.cells[0].outputs
    widgets = [o for o in outputs if o.get("output_type") == "display_data"
               and WIDGET_MIME in o.get("data", {})]
    assert len(widgets) == 2  # one bar per epoch
    printed = "".join(o.get("text", "") for o in outputs
                      if o.get("output_type") == "stream" and o.get("name") == "stdout")
    assert "Epoch" not in printed  # no text bar next to the widget
    assert printed.strip() == "[(4, 4, 'success'), (4, 4, 'success')]"
