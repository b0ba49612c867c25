"""Compressed pushes for ParameterServerStrategy: the knob (`compression=` or the
`compression` setter) and the counters. Each worker encodes its own pushes and keeps its own
error-feedback residuals (parameter_server/compressed_push.py); the parameter servers decode."""

from __future__ import annotations

from typing import Any

from labdist.collectives import compression as compressors


class PushCompressionModes:
    """Mixed into ParameterServerStrategy."""

    _push_compressor: compressors.Compressor | None = None

    @staticmethod
    def _parse_compression(value: Any) -> compressors.Compressor | None:
        """Check the constructor's knob before anything starts."""
        return compressors.parse(value)

    @property
    def compression(self) -> compressors.Compressor | None:
        """The compressor of every worker's pushes (None: plain). Settable: 'none', 'fp16',
        'bf16', or `ld.compression.TopK(ratio)` / `PowerSGD(rank)`; each worker's residuals
        carry over a change (they go out with its next push). A lost worker is left out:
        training goes on without it."""
        return self._push_compressor

    @compression.setter
    def compression(self, value: Any) -> None:
        compressor = compressors.parse(value)
        self._check_open()
        group = self._ps_group
        group.call_live_workers("set_compression", compressor)
        self._push_compressor = compressor

    def push_stats(self) -> list[dict[str, Any]]:
        """Per worker: `raw_bytes` (its pushed updates' array bytes uncompressed),
        `sent_bytes` (what they took on the wire, compressed) and `residual_norm` (None for
        a lost worker: its counters went with it)."""
        self._check_open()
        return self._ps_group.call_live_workers("push_stats")
