"""The strategies a lab switches between, all on one Dask cluster: the one it was given (or
started), and the others made on the same cluster the first time a switch needs them (one
parameter-server strategy per mode and `use_locking`, which are fixed when it is made).
The lab closes only what it made."""

from __future__ import annotations

from typing import Any

from labdist.cluster.dashboard import proxied_link
from labdist.lab.backends import MirroredBackend
from labdist.lab.models import LabModel, ParamSpec


def strategy_key(strategy: Any) -> tuple:
    """The RunConfig.strategy_key a strategy serves: ("ps_async" | "ps_sync", use_locking) for a
    parameter-server strategy, ("mirrored",) for anything else (check_strategy says whether
    the lab takes it)."""
    from labdist.parameter_server import ParameterServerStrategy

    if isinstance(strategy, ParameterServerStrategy):
        return ("ps_" + strategy.mode, strategy.use_locking)
    return ("mirrored",)


def check_strategy(strategy: Any) -> None:
    from labdist.strategies import MirroredStrategy

    if strategy_key(strategy)[0] != "mirrored":
        if strategy.num_ps < 1:
            raise ValueError(f"strategy={strategy!r} has no parameter server")
        return
    if not isinstance(strategy, MirroredStrategy):
        raise TypeError(f"strategy={strategy!r} is not supported by the lab; use "
                        "ld.MirroredStrategy(...) or ld.ParameterServerStrategy(...)")


class StrategyPool:
    def __init__(self, strategy: Any, num_replicas: int | None):
        from labdist.strategies import MirroredStrategy

        self._owned: list[Any] = []
        if strategy is None:
            strategy = MirroredStrategy(num_replicas=num_replicas or 2)
            self._owned.append(strategy)
        else:
            check_strategy(strategy)
        self.first = strategy
        self.num_replicas = (strategy.num_workers if strategy_key(strategy)[0] != "mirrored"
                             else strategy.num_replicas_in_sync)
        if num_replicas is not None and num_replicas != self.num_replicas:
            raise ValueError(f"num_replicas={num_replicas!r} but strategy={strategy!r} has "
                             f"{self.num_replicas}; leave num_replicas out")
        self._strategies: dict[tuple, Any] = {strategy_key(strategy): strategy}
        self._backends: dict[tuple, Any] = {}

    @property
    def dashboard_link(self) -> str | None:
        link = getattr(self.first, "dashboard_link", None)
        if link is None:
            client = getattr(self.first, "client", None)
            link = proxied_link(getattr(client, "dashboard_link", None))
        return link

    def strategy(self, key: tuple) -> Any:
        if key not in self._strategies:
            self._strategies[key] = self._make(key)
        return self._strategies[key]

    def _make(self, key: tuple) -> Any:
        client = self.first.client
        if key[0] == "mirrored":
            from labdist.strategies import MirroredStrategy

            made = MirroredStrategy(num_replicas=self.num_replicas, cluster=client)
        else:
            from labdist.parameter_server import ParameterServerStrategy

            made = ParameterServerStrategy(cluster=client, num_workers=self.num_replicas,
                                           num_ps=1, mode=key[0][3:], use_locking=key[1])
        self._owned.append(made)
        return made

    def backend(self, key: tuple, model: LabModel, spec: ParamSpec):
        if key not in self._backends:
            strategy = self.strategy(key)
            if key[0] == "mirrored":
                self._backends[key] = MirroredBackend(strategy, model, spec)
            else:
                from labdist.lab.ps_backend import ParameterServerBackend

                self._backends[key] = ParameterServerBackend(strategy, model, spec)
        return self._backends[key]

    def close(self) -> None:
        for backend in self._backends.values():
            backend.close()
        for s in reversed(self._owned):  # the first one made owns the cluster: last
            s.close()
        self._owned.clear()
