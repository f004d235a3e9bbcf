"""Kubernetes quantities as whole MiB, the unit GPU memory is budgeted in."""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

_SUFFIX = {
    "": Decimal(1), "k": Decimal(10) ** 3, "M": Decimal(10) ** 6, "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12, "P": Decimal(10) ** 15, "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10, "Mi": Decimal(2) ** 20, "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40, "Pi": Decimal(2) ** 50, "Ei": Decimal(2) ** 60,
}
_RE = re.compile(r"^([+]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")
MIB = Decimal(2) ** 20


def quantity_bytes(value: str | int | float) -> Decimal:
    """Bytes of a quantity such as ``40Gi`` or ``1.5G``; ValueError names the bad input."""
    if isinstance(value, int | float):
        return Decimal(str(value))
    m = _RE.match(value.strip())
    if not m:
        raise ValueError(f"{value!r} is not a quantity (e.g. 40Gi, 4096Mi)")
    try:
        number = Decimal(m.group(1))
    except InvalidOperation as exc:
        raise ValueError(f"{value!r} is not a quantity (e.g. 40Gi, 4096Mi)") from exc
    return number * _SUFFIX[m.group(2) or ""]


def memory_mib(value: str | int | float) -> int:
    """A GPU-memory quantity in whole MiB, rounded up (a budget never rounds down)."""
    return math.ceil(quantity_bytes(value) / MIB)


def mib_quantity(mib: int) -> str:
    """MiB back to the quantity string status shows (``40Gi`` when exact, else ``…Mi``)."""
    if mib and mib % 1024 == 0:
        return f"{mib // 1024}Gi"
    return f"{mib}Mi"


def count(value: str | int | float) -> int:
    """A plain count resource (pods, cores, MIG instances) as an int."""
    q = quantity_bytes(value)
    if q != q.to_integral_value():
        raise ValueError(f"{value!r} must be a whole number")
    return int(q)
