"""The ``sim`` visibility's device files of a container's units, for either plugin (I/O: the
simulated driver's capability table, read at the first use; it never changes)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tessera_node.container.device_files import (
    DeviceFilesError,
    Unit,
    container_files,
    parse_mig_minors,
)
from tessera_node.container.response import SimPaths, Visibility


class SimDeviceFiles:
    def __init__(self, visibility: Visibility, sim: SimPaths | None) -> None:
        self.sim = sim if visibility == "sim" else None
        self._minors: dict[str, int] | None = None

    def of(self, uuids: Sequence[str], units: Sequence[Unit]) -> tuple[str, ...]:
        """The units' device files (none but with the ``sim`` visibility); raises
        DeviceFilesError (an OSError's text included when the table cannot be read)."""
        if self.sim is None:
            return ()
        if self._minors is None:
            try:
                self._minors = parse_mig_minors(Path(self.sim.mig_minors).read_text())
            except OSError as exc:
                raise DeviceFilesError(str(exc)) from exc
        return container_files(uuids, units, self._minors)
