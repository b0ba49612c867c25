"""The lab's communication modes on a mirrored engine: the strategy's compressor and local SGD
/ DiLoCo settings, set through its public setters at a step boundary, and the round state
DiLoCo keeps per variable set (`OuterVariables`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from labdist.collectives import compression
from labdist.enums import VariableAggregation as Agg
from labdist.lab import replica_steps
from labdist.lab.config import RunConfig
from labdist.training import optimizers
from labdist.training.trainer import diloco


def compressor(config: RunConfig) -> compression.Compressor | None:
    """The compressor a config asks for (error feedback on)."""
    if config.compression == "topk":
        return compression.TopK(config.topk_ratio)
    if config.compression == "powersgd":
        return compression.PowerSGD(config.powersgd_rank)
    return compression.parse(config.compression)


def local_sgd(config: RunConfig) -> tuple[int | None, Any]:
    """(local_steps, outer optimizer) for `strategy.set_local_sgd` ((None, None): off)."""
    if not config.local_steps:
        return None, None
    return config.local_steps, optimizers.SGD(config.outer_lr, momentum=config.outer_momentum,
                                              nesterov=config.outer_momentum > 0)


class Modes:
    """What one mirrored engine has set on its strategy, and DiLoCo's variables per set."""

    def __init__(self, strategy):
        self.strategy = strategy
        self._outers: dict[int, diloco.OuterVariables] = {}
        self._variables: dict[str, Any] = {}
        self.outer: diloco.OuterVariables | None = None
        self._compression: tuple = ("none",)
        self._local: tuple = (0,)
        # after a mode is turned off, one more step goes the communicating way: it sends the
        # error-feedback residuals still owed and closes a DiLoCo round in progress
        self._owed = False

    @property
    def active(self) -> bool:
        return self._compression != ("none",) or self._local != (0,) or self._owed

    def use(self, config: RunConfig, variables: dict[str, Any]) -> None:
        """A switch wrote new copies into `variables`: a round in progress is forgotten (the
        switch's resync made the copies one), then the modes are set."""
        self._variables = variables
        self.outer = self._outers.get(id(variables))
        if self.outer is not None:
            self.strategy.run(replica_steps.reset_round, args=(self.outer,))
        self._owed = False
        self.configure(config)

    def fresh(self) -> None:
        """The lab's start and reset: forget what the modes carried from before (residuals owed,
        warm-start factors, DiLoCo's rounds and outer momentum), as the values go back to
        their start. The settings stay."""
        self.strategy.run(replica_steps.fresh_communication, args=(list(self._outers.values()),))
        self._owed = False

    def configure(self, config: RunConfig) -> None:
        """Set what changed on the strategy (each setter runs as a step of its own)."""
        if config.communicates_less and self.outer is None:  # DiLoCo's round state, once
            with self.strategy.scope():
                self.outer = diloco.OuterVariables(list(self._variables.values()))
            self._outers[id(self._variables)] = self.outer
        wanted_c = (config.compression, config.topk_ratio if config.compression == "topk"
                    else config.powersgd_rank if config.compression == "powersgd" else None)
        if config.compression == "none":
            wanted_c = ("none",)
        wanted_l = (config.local_steps, config.outer_lr, config.outer_momentum) \
            if config.local_steps else (0,)
        if wanted_c != self._compression:
            self.strategy.compression = compressor(config)
            self._owed = self._owed or wanted_c == ("none",)
            self._compression = wanted_c
        if wanted_l != self._local:
            self.strategy.set_local_sgd(*local_sgd(config))
            self._owed = self._owed or wanted_l == (0,)
            self._local = wanted_l

    def settle(self, config: RunConfig, variables: dict[str, Any], state: dict[str, Any]
               ) -> list[np.ndarray] | None:
        """The copies of `variables` are about to move (a switch of kind, synchronization or
        aggregation): turn the modes off and run one closing step that ends a DiLoCo round
        in progress with its outer step and sends the residuals owed (`replica_steps.closing_step`,
        with `config`'s learning rate), so no update is lost or applied twice. Returns every
        replica's copy after it, `state` (the model's, untouched) after the parameters (None:
        nothing was open)."""
        if not self.active:
            return None
        self.close()
        args = (variables, state, self.outer, config.learning_rate,
                config.aggregation is Agg.MEAN)
        copies = self.strategy.run_transaction(replica_steps.closing_step, lambda n: args)
        self._owed = False
        return [np.array(c, np.float64) for c in copies]

    def close(self) -> None:
        """Leave the strategy as the lab found it: no compressor, no local SGD."""
        if self._compression != ("none",):
            self.strategy.compression = None
        if self._local != (0,):
            self.strategy.set_local_sgd(None)
        self._compression, self._local = ("none",), (0,)

    def record(self, infos: list[dict]) -> dict:
        """The step's per-replica communication summaries as one record entry."""
        self._owed = False
        first = infos[0]
        return {"bytes": [int(i["bytes"]) for i in infos],
                "residual_norm": [float(i["residual_norm"]) for i in infos],
                "since": int(first["since"]), "rounds": int(first["rounds"]),
                "pseudo_norm": first["pseudo_norm"], "outer_norm": first["outer_norm"]}
