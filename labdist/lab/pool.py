"""The strategies a lab switches between, all on one Dask cluster: the one it was given (or
started), and the others made on the same cluster the first time a switch needs them (one
parameter-server strategy per mode and `use_locking`, which are fixed when it is made).
The lab closes only what it made."""

from __future__ import annotations

from typing import Any

from labdist.lab.config import Kind, StrategyKey
from labdist.lab.engines import MirroredEngine
from labdist.lab.models import LabModel, ParamSpec
from labdist.timing.dashboard import proxied_link

CHUNKS = 4  # the lab's PS strategies apply the parameter vector in up to this many chunks


def chunk_size(num_parameters: int) -> int:
    """Elements per chunk for a model of `num_parameters`: a few chunks (w and b apart for
    `Linear(1)`), so updates can interleave, and the apply delay costs an update a few
    holds, however big the model."""
    return max(1, -(-num_parameters // CHUNKS))


def strategy_key(strategy: Any) -> StrategyKey:
    """The RunConfig.strategy_key a strategy serves: (PS_ASYNC | PS_SYNC, use_locking) for a
    parameter-server strategy, (MIRRORED, False) for anything else (check_strategy says
    whether the lab takes it)."""
    from labdist.parameter_server import ParameterServerStrategy

    if isinstance(strategy, ParameterServerStrategy):
        return StrategyKey(Kind.of_ps_mode(strategy.mode), strategy.use_locking)
    return StrategyKey(Kind.MIRRORED)


def check_strategy(strategy: Any) -> None:
    from labdist.strategies import MirroredStrategy

    if strategy_key(strategy).kind.is_ps:
        if strategy.num_ps < 1:
            raise ValueError(f"strategy={strategy!r} has no parameter server")
        return
    if not isinstance(strategy, MirroredStrategy):
        raise TypeError(f"strategy={strategy!r} is not supported by the lab; use "
                        "ld.MirroredStrategy(...) or ld.ParameterServerStrategy(...)")


class StrategyPool:
    def __init__(self, strategy: Any, num_replicas: int | None, num_parameters: int = 1,
                 fault_tolerance: str = "none"):
        from labdist.strategies import MirroredStrategy

        self._owned: list[Any] = []
        self._chunk_size = chunk_size(num_parameters)
        if strategy is None:
            strategy = MirroredStrategy(num_replicas=num_replicas or 2,
                                        fault_tolerance=fault_tolerance)
            self._owned.append(strategy)
        else:
            check_strategy(strategy)
        self.first = strategy
        self.num_replicas = (strategy.num_workers if strategy_key(strategy).kind.is_ps
                             else strategy.num_replicas_in_sync)
        if num_replicas is not None and num_replicas != self.num_replicas:
            raise ValueError(f"num_replicas={num_replicas!r} but strategy={strategy!r} has "
                             f"{self.num_replicas}; leave num_replicas out")
        self._strategies: dict[StrategyKey, Any] = {strategy_key(strategy): strategy}
        self._engines: dict[StrategyKey, Any] = {}

    @property
    def dashboard_link(self) -> str | None:
        link = self.first.dashboard_link
        if link is None and self.first.client is not None:  # a cluster it was given
            link = proxied_link(self.first.client.dashboard_link)
        return link

    def strategy(self, key: StrategyKey) -> Any:
        if key not in self._strategies:
            self._strategies[key] = self._make(key)
        return self._strategies[key]

    def _make(self, key: StrategyKey) -> Any:
        client = self.first.client
        if not key.kind.is_ps:
            from labdist.strategies import MirroredStrategy

            made = MirroredStrategy(num_replicas=self.num_replicas, cluster=client)
        else:
            from labdist.parameter_server import ParameterServerStrategy

            made = ParameterServerStrategy(cluster=client, num_workers=self.num_replicas,
                                           num_ps=1, mode=key.kind.ps_mode,
                                           use_locking=key.use_locking,
                                           chunk_size=self._chunk_size)
        self._owned.append(made)
        return made

    def engine(self, key: StrategyKey, model: LabModel, spec: ParamSpec):
        if key not in self._engines:
            strategy = self.strategy(key)
            if not key.kind.is_ps:
                self._engines[key] = MirroredEngine(strategy, model, spec)
            else:
                from labdist.lab.ps_engine import ParameterServerEngine

                self._engines[key] = ParameterServerEngine(strategy, key.kind, model, spec)
        return self._engines[key]

    def fresh(self) -> None:
        """The lab's start and reset: every engine made so far starts its modes afresh."""
        for engine in self._engines.values():
            engine.fresh()

    def close(self) -> None:
        for engine in self._engines.values():
            engine.close()
        for s in reversed(self._owned):  # the first one made owns the cluster: last
            s.close()
        self._owned.clear()
