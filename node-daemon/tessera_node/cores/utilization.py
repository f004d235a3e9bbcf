"""What a GPU's controller measures: NVML's per-process utilisation since its last sample,
read through the daemon's NVML reader (:mod:`tessera_node.device.nvml`, the one place that
calls NVML), so a MIG change that pauses NVML pauses the controllers' reads too."""

from __future__ import annotations

from typing import Protocol


class UtilizationSource(Protocol):
    def sample(self) -> tuple[dict[int, float], tuple[float, float] | None]:
        """Busy fraction per PID over the window (start, end) in wall-clock seconds that the
        newest samples cover, or ({}, None) when there is nothing new."""
        ...


class ProcessUtilization(Protocol):
    """The reader's per-process utilisation (``NvmlReader.process_utilization``)."""

    def process_utilization(self, index: int, since_us: int
                            ) -> tuple[dict[int, float], int] | None: ...


class ReaderUtilization:
    """The daemon's NVML reader's per-process utilisation of one GPU (by index), since the
    last sample seen."""

    def __init__(self, reader: ProcessUtilization, index: int) -> None:
        self._reader = reader
        self._index = index
        self._last_us = 0

    def sample(self) -> tuple[dict[int, float], tuple[float, float] | None]:
        got = self._reader.process_utilization(self._index, self._last_us)
        if got is None:
            return {}, None
        busy, newest = got
        first, start = self._last_us == 0, self._last_us
        self._last_us = max(self._last_us, newest)
        if first or self._last_us <= start:
            return {}, None  # the first answer covers an unknown span: only a baseline
        return {pid: pct / 100.0 for pid, pct in busy.items()}, (start / 1e6, newest / 1e6)
