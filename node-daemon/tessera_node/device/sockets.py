"""The sockets in the kubelet's device-plugin directory: each registered device plugin's,
and the kubelet's own (another GPU device plugin shows here, ``nvidia-gpu.sock``)."""

from __future__ import annotations

import os


def device_plugin_sockets(directory: str) -> tuple[str, ...]:
    """Socket names in the kubelet's device-plugin directory (none when it is absent)."""
    try:
        return tuple(sorted(n for n in os.listdir(directory) if n.endswith(".sock")))
    except OSError:
        return ()
