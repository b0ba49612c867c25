"""labdist on 2 replicas (MirroredStrategy, an embedded LocalCluster of 2 worker processes;
`--mode fit` takes LABDIST_BENCH_REPLICAS replicas and LABDIST_BENCH_HIDDEN layers, _common.py):
`--mode fit` trains with `model.fit` (`--spe`: steps_per_execution); `--mode loop` is a user's
custom loop in README style: variables made under the scope, a step function that computes
its shard's gradients with labdist.training's building blocks and applies them with
`optimizer.apply_gradients` (TF's idiom, as in tf_custom.py: one all-reduce that sums the
gradients of losses scaled by the global batch), one `strategy.run` per step over
`strategy.experimental_distribute_dataset`. `--update assign` is the older idiom instead:
`ctx.all_reduce("MEAN", grads)`, then `v.assign_sub(lr * g)` on MEAN variables (each assign
reduces its delta again). With `--steps-per-call k` > 1 the loop uses
labdist's k-steps-per-call API when this labdist has one (see `run_k_steps`). `--input
pipelines` feeds the loop from `distribute_datasets_from_function` instead, one pipeline per
replica (its half of every global batch), which moves to the replicas once: no batch travels
from the driver.

Run: `python bench/baselines/labdist_train.py --mode fit --spe 10 --batch 64 --steps 300`.
"""

from __future__ import annotations

import inspect
import itertools

import numpy as np
from _common import (
    CLASSES,
    HIDDEN,
    LAYERS,
    LEARNING_RATE,
    REPLICAS,
    data,
    emit,
    fail,
    parse,
    timed_passes,
)

import labdist as ld
from labdist.training import layers, losses

NET = [layers.Dense(HIDDEN, activation="relu"), layers.Dense(CLASSES, activation="softmax")]
VARIABLES: list = []  # [kernel 0, bias 0, kernel 1, bias 1], made under the strategy's scope
OPTIMIZER = ld.optimizers.SGD(LEARNING_RATE)
SETTINGS = {"global_batch": 0, "update": "apply"}  # set by loop_runner


def train_step(x, y):
    """One replica's step on its shard (x, y), README style; returns the shard's mean loss."""
    ctx = ld.get_replica_context()
    xp = ctx.xp
    k0, b0, k1, b1 = (v.read_value() for v in VARIABLES)
    h, cache0 = NET[0].forward(xp, {"kernel": k0, "bias": b0}, x)
    p, cache1 = NET[1].forward(xp, {"kernel": k1, "bias": b1}, h)
    # the shard's mean cross-entropy, written out: the runner also runs under older labdist
    # trees (--before), whose loss objects are called differently
    labels = y.reshape(-1).astype("int64")
    loss = -xp.log(xp.clip(p[xp.arange(len(labels)), labels], losses.EPSILON, 1)).mean()
    dz = losses.fused_softmax_grad(xp, y, p)  # d (this shard's mean loss) / d logits
    if SETTINGS["update"] == "apply":  # the loss over the global batch, as TF scales it
        dz *= len(x) / SETTINGS["global_batch"]
    dh, g1 = NET[1].backward_linear(xp, {"kernel": k1, "bias": b1}, cache1[0], dz)
    _, g0 = NET[0].backward(xp, {"kernel": k0, "bias": b0}, cache0, dh, input_grad=False)
    grads = [g0["kernel"], g0["bias"], g1["kernel"], g1["bias"]]
    if SETTINGS["update"] == "apply":
        OPTIMIZER.apply_gradients(zip(grads, VARIABLES, strict=True))  # one summing all-reduce
    else:
        for v, g in zip(VARIABLES, ctx.all_reduce("MEAN", grads), strict=True):
            v.assign_sub(LEARNING_RATE * g)  # every copy takes the same step
    return loss


def has_k_steps(strategy) -> bool:
    """Whether this labdist's `strategy.run` takes `steps=k` (issue 15's k steps per call)."""
    try:
        return "steps" in inspect.signature(strategy.run).parameters
    except (TypeError, ValueError):
        return False


def batch_step(batch):
    """`train_step` on one (x, y) batch: what `steps=k` calls with each batch it takes."""
    return train_step(*batch)


def run_k_steps(strategy, iterator, k: int):
    """k steps in one call, as labdist spells it (TF's idiom is a loop inside tf.function):
    `iterator` is a distributed dataset's iterator, whose batches each step takes in turn."""
    return strategy.run(batch_step, args=(iterator,), steps=k)


def fit_runner(strategy, x, y, args):
    with strategy.scope():
        hidden = [ld.layers.Dense(w, activation="relu") for w in LAYERS]
        hidden[0] = ld.layers.Dense(LAYERS[0], activation="relu", input_shape=(x.shape[1],))
        model = ld.models.Sequential([*hidden, ld.layers.Dense(CLASSES, activation="softmax")])
        model.compile(loss="sparse_categorical_crossentropy",
                      optimizer=ld.optimizers.SGD(LEARNING_RATE), steps_per_execution=args.spe)

    def run(steps: int) -> None:
        model.fit(x[:steps * args.batch], y[:steps * args.batch], batch_size=args.batch,
                  epochs=1, shuffle=False, verbose=0)

    return run


def loop_runner(strategy, x, y, args):
    rng = np.random.default_rng(0)
    with strategy.scope():
        for layer, n_in in zip(NET, (x.shape[1], HIDDEN), strict=True):
            for name, value in layer.build(n_in, rng).items():
                VARIABLES.append(ld.Variable(value, aggregation="MEAN", name=name))
    SETTINGS.update(global_batch=args.batch, update=args.update)
    k = args.steps_per_call
    if k > 1 and not has_k_steps(strategy):
        fail(f"not measured: this labdist's strategy.run has no steps= (k = {k} per call)")
    if args.input == "pipelines":
        return pipeline_runner(strategy, x, y, args, k)
    dataset = strategy.experimental_distribute_dataset(ld.batches((x, y), args.batch))

    def run(steps: int) -> None:
        batches = itertools.islice(itertools.cycle(dataset), steps)
        if k == 1:
            for bx, by in batches:
                strategy.run(train_step, args=(bx, by))
        else:  # one pass over the dataset holds exactly --steps batches
            iterator = iter(dataset)
            for _ in range(steps // k):
                run_k_steps(strategy, iterator, k)

    return run


class Endless:
    """A replica's pipeline: its shard of every global batch, pass after pass. It declares a
    length (more than any run takes) so that no step needs a collective to learn whether
    another replica's input ended."""

    def __init__(self, batches):
        self.batches = batches

    def __len__(self) -> int:
        return 1 << 40

    def __iter__(self):
        while True:
            yield from self.batches


def pipeline_runner(strategy, x, y, args, k: int):
    n = strategy.num_replicas_in_sync
    per = args.batch // n
    options = ld.InputOptions(experimental_replication_mode=ld.InputReplicationMode.PER_REPLICA)

    def dataset_fn(ctx):  # replica r: rows r*per..(r+1)*per of every global batch
        rows = np.arange(len(x)).reshape(-1, args.batch)[:, ctx.input_pipeline_id * per:
                                                          (ctx.input_pipeline_id + 1) * per]
        return Endless(ld.batches((x[rows.ravel()], y[rows.ravel()]), per))

    iterator = iter(strategy.distribute_datasets_from_function(dataset_fn, options))

    def run(steps: int) -> None:
        for _ in range(steps // k):
            run_k_steps(strategy, iterator, k)

    return run


def main() -> None:
    def extra(p):
        p.add_argument("--mode", choices=("fit", "loop"), required=True)
        p.add_argument("--spe", type=int, default=1, help="fit's steps_per_execution")
        p.add_argument("--steps-per-call", type=int, default=1, help="loop: k steps per call")
        p.add_argument("--update", choices=("apply", "assign"), default="apply",
                       help="loop: optimizer.apply_gradients, or all_reduce + assign_sub")
        p.add_argument("--input", choices=("driver", "pipelines"), default="driver",
                       help="loop: batches drawn on the driver, or pipelines on the replicas")

    args = parse(__doc__.splitlines()[0], extra)
    unit = max(args.spe, args.steps_per_call)  # steps per call
    if args.steps % unit:
        fail("--steps must be a multiple of --spe and --steps-per-call")
    x, y = data(args.batch * args.steps)
    with ld.MirroredStrategy(num_replicas=REPLICAS) as strategy:
        make = fit_runner if args.mode == "fit" else loop_runner
        run = make(strategy, x, y, args)
        run(max(unit, args.warmup // unit * unit))
        rates = timed_passes(lambda: run(args.steps), args.steps, args.passes)
        emit(rates, mode=args.mode, spe=args.spe, steps_per_call=args.steps_per_call,
             replicas=REPLICAS, layers=LAYERS,
             transport=strategy.transport, k_steps_api=has_k_steps(strategy))


if __name__ == "__main__":
    main()
