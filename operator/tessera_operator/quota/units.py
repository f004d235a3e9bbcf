"""Kubernetes quantities as whole MiB and counts, read with apimachinery's exact parser.

Every quantity tessera reads (a GPUQuota's ``hard``/``default``/``max``, its ``status.used``,
a pod's ``tessera.dev/`` limits) goes through :mod:`tessera.api.quantity`, the port of
``resource.ParseQuantity``: what the API server stores and what CEL compares is what
admission and the recount sum, down to the byte.  A value that cannot be read raises
:class:`~tessera.api.quantity.QuantityError` (a ``ValueError``) naming the input; callers
turn it into an error the user sees, never into "no limit".
"""

from __future__ import annotations

import math
from decimal import Decimal

from tessera.api.quantity import QuantityError, quantity_value

MIB = Decimal(2) ** 20


def quantity_bytes(value: str | int) -> Decimal:
    """The exact value of a quantity such as ``40Gi``, ``1.5G`` or ``10000000000000m``."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise QuantityError(f"{value!r} is not a quantity (e.g. 40Gi, 4096Mi)")
    return quantity_value(value)


def memory_mib(value: str | int) -> int:
    """A GPU-memory quantity in whole MiB, rounded up (a budget never rounds down)."""
    q = quantity_bytes(value)
    if q < 0:
        raise QuantityError(f"{value!r} must not be negative")
    return math.ceil(q / MIB)


def mib_quantity(mib: int) -> str:
    """MiB back to the quantity string status shows (``40Gi`` when exact, else ``…Mi``)."""
    if mib and mib % 1024 == 0:
        return f"{mib // 1024}Gi"
    return f"{mib}Mi"


def count(value: str | int) -> int:
    """A plain count resource (pods, cores, MIG instances) as an int."""
    q = quantity_bytes(value)
    if q != q.to_integral_value():
        raise QuantityError(f"{value!r} must be a whole number")
    return int(q)
