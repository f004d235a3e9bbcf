"""Kubernetes resource quantities, parsed exactly as apimachinery's ``ParseQuantity`` does.

GPUQuota memory totals are written by people (``40Gi``), compared by the API server with
CEL's ``quantity()`` and summed by admission, so every part must agree on what a string
means down to the byte.  The scanner below follows ``resource.parseQuantityString`` and
``resource.ParseQuantity`` step by step (including their quirks: ``1.`` and ``.5`` are
numbers, non-zero values round *up* to the next nano, binary-suffixed values are capped
at 2^63-1) rather than a regular expression that would almost agree.
"""

from __future__ import annotations

import decimal
import re
from decimal import Decimal
from typing import Any, Literal

from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import core_schema

Format = Literal["DecimalSI", "BinarySI", "DecimalExponent"]

_DECIMAL_SUFFIXES: dict[str, int] = {
    "n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18,
}
_BINARY_SUFFIXES: dict[str, int] = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_SUFFIX_CHARS = frozenset("eEinumkKMGTP")
_DIGITS = frozenset("0123456789")
_INT64_MAX = 2**63 - 1
_NANO = Decimal("1e-9")

# What the generated CRD lets through for a non-negative quantity string: kubebuilder's
# Quantity pattern without the minus sign and with integer exponents of at most two digits,
# so that every string the API server stores also parses here, to the value apimachinery
# gives it (and CEL's ``quantity()``).  Longer exponents are refused: apimachinery wraps them
# to 32 bits, and around the wrap its arithmetic on the result runs without bound.
QUANTITY_PATTERN = (
    r"^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE][+-]?[0-9]{1,2}))?$"
)
_QUANTITY_RE = re.compile(QUANTITY_PATTERN)
QUANTITY_MAX_LENGTH = 64


class QuantityError(ValueError):
    """A string Kubernetes would refuse as a quantity."""


def _scan(text: str) -> tuple[bool, str, str, str, str]:
    """``parseQuantityString``: (positive, value, numerator, denominator, suffix)."""
    positive = True
    pos = 0
    end = len(text)
    if pos < end and text[0] in "+-":
        positive = text[0] == "+"
        pos += 1
    # strip leading zeros
    while True:
        if pos >= end:
            return positive, "0", "0", "", ""
        if text[pos] != "0":
            break
        pos += 1
    start = pos
    while pos < end and text[pos] in _DIGITS:
        pos += 1
    num = text[start:pos] or "0"
    if pos >= end:
        return positive, text, num, "", ""
    denom = ""
    if text[pos] == ".":
        pos += 1
        start = pos
        while pos < end and text[pos] in _DIGITS:
            pos += 1
        denom = text[start:pos]
        if pos >= end:
            return positive, text, num, denom, ""
    value = text[:pos]
    suffix_start = pos
    while pos < end and text[pos] in _SUFFIX_CHARS:
        pos += 1
    if pos >= end:
        return positive, value, num, denom, text[suffix_start:]
    if text[pos] in "+-":
        pos += 1
    while pos < end:
        if text[pos] not in _DIGITS:
            raise QuantityError(f"quantity {text!r} has an invalid suffix")
        pos += 1
    return positive, value, num, denom, text[suffix_start:]


def _go_parse_int64(text: str) -> int | None:
    """``strconv.ParseInt(text, 10, 64)``: optional sign, decimal digits, int64 range."""
    body = text[1:] if text[:1] in ("+", "-") else text
    if not body or any(c not in _DIGITS for c in body):
        return None
    number = int(text)
    return number if -(2**63) <= number <= _INT64_MAX else None


def _interpret(suffix: str) -> tuple[int, int, Format]:
    """``suffixHandler.interpret``: (base, exponent, format) or QuantityError."""
    if suffix in _DECIMAL_SUFFIXES:
        return 10, _DECIMAL_SUFFIXES[suffix], "DecimalSI"
    if suffix in _BINARY_SUFFIXES:
        return 2, _BINARY_SUFFIXES[suffix], "BinarySI"
    if len(suffix) > 1 and suffix[0] in "eE":
        parsed = _go_parse_int64(suffix[1:])
        if parsed is not None:
            # Go converts with int32(parsed): wrap exactly as it does.
            wrapped = (parsed + 2**31) % 2**32 - 2**31
            return 10, wrapped, "DecimalExponent"
    raise QuantityError(f"quantity suffix {suffix!r} is not one Kubernetes knows")


def parse_quantity(text: str) -> tuple[Decimal, Format]:
    """Parse ``text`` into its exact value and format, or raise :class:`QuantityError`."""
    if not text:
        raise QuantityError("quantity is empty")
    if text == "0":
        return Decimal(0), "DecimalSI"
    positive, value, num, denom, suffix = _scan(text)
    base, exponent, fmt = _interpret(suffix)
    digits = value.lstrip("+-").replace(".", "")
    if digits and any(c not in _DIGITS for c in digits):  # pragma: no cover - scanner guarantees
        raise QuantityError(f"quantity {text!r} has an invalid number")
    if not digits:
        # Go's fast path turns a digit-less number ("." "-" "+.") into zero; only its slow
        # path (inf.Dec.SetString) refuses it.  The slow path is taken for decimal exponents
        # below nano, and for binary suffixes whose precision estimate (15 digits, less the
        # numerator "0", less exponent*3/10, less one) goes negative: Pi and Ei.
        slow = exponent < -9 if base == 10 else 15 - 1 - exponent * 3 // 10 - 1 < 0
        if slow:
            raise QuantityError(f"quantity {text!r} has no digits")
        return Decimal(0), fmt
    magnitude = Decimal(f"{num}.{denom}" if denom else num)
    with decimal.localcontext() as ctx:
        ctx.prec = len(text) + 64
        ctx.Emax = decimal.MAX_EMAX
        ctx.Emin = decimal.MIN_EMIN
        ctx.traps[decimal.Inexact] = False
        amount = magnitude.scaleb(exponent) if base == 10 else magnitude * (2**exponent)
        if amount != 0 and amount.as_tuple().exponent < -9:  # type: ignore[operator]
            amount = amount.quantize(_NANO, rounding=decimal.ROUND_UP)
        if fmt == "BinarySI" and amount > _INT64_MAX:
            amount = Decimal(_INT64_MAX)
        if fmt == "BinarySI" and 0 < amount < 1:
            fmt = "DecimalSI"
        return (amount if positive else -amount), fmt


def quantity_value(text: str | int) -> Decimal:
    """The exact value of a quantity given as a string or, as YAML allows, an integer."""
    if isinstance(text, bool):
        raise QuantityError("a quantity is a string or an integer, not a boolean")
    if isinstance(text, int):
        if not -(2**63) <= text <= _INT64_MAX:
            raise QuantityError(f"integer quantity {text} does not fit in 64 bits")
        return Decimal(text)
    return parse_quantity(text)[0]


def to_bytes(text: str | int) -> int:
    """The quantity as a whole number, rounded up (``Quantity.Value()``); for byte counts."""
    value = quantity_value(text)
    if value != 0 and value.adjusted() > 19:
        raise QuantityError(f"quantity {text!r} does not fit in 64 bits")
    integral = int(value.to_integral_value(rounding=decimal.ROUND_CEILING))
    if not -(2**63) <= integral <= _INT64_MAX:
        raise QuantityError(f"quantity {text!r} does not fit in 64 bits")
    return integral


class Quantity:
    """A quantity as written in a manifest, compared and hashed by its exact value.

    It keeps the user's spelling so that a round trip through the types changes nothing
    in Git (Argo CD would otherwise see a diff), while comparisons use the value.
    """

    __slots__ = ("raw", "value")

    def __init__(self, raw: str | int) -> None:
        if isinstance(raw, str) and not _QUANTITY_RE.fullmatch(raw):
            if len(raw) > QUANTITY_MAX_LENGTH:
                raise QuantityError(f"quantity is longer than {QUANTITY_MAX_LENGTH} characters")
            raise QuantityError(
                f"{raw!r} is not a non-negative Kubernetes quantity (e.g. 40Gi, 512Mi, 8G)"
            )
        if isinstance(raw, str) and len(raw) > QUANTITY_MAX_LENGTH:
            raise QuantityError(f"quantity is longer than {QUANTITY_MAX_LENGTH} characters")
        value = quantity_value(raw)
        if value < 0:
            raise QuantityError(f"quantity {raw!r} must not be negative")
        self.raw: str | int = raw
        self.value: Decimal = value

    def to_bytes(self) -> int:
        return to_bytes(self.raw)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Quantity):
            return self.value == other.value
        return NotImplemented

    def __lt__(self, other: Quantity) -> bool:
        return self.value < other.value

    def __le__(self, other: Quantity) -> bool:
        return self.value <= other.value

    def __hash__(self) -> int:
        return hash(self.value)

    def __str__(self) -> str:
        return str(self.raw)

    def __repr__(self) -> str:
        return f"Quantity({self.raw!r})"

    @classmethod
    def _validate(cls, raw: Any) -> Quantity:
        if isinstance(raw, Quantity):
            return raw
        if isinstance(raw, bool) or not isinstance(raw, str | int):
            raise QuantityError("must be a quantity: a string such as 40Gi or an integer")
        return cls(raw)

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: type[Any], handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(
            cls._validate,
            serialization=core_schema.plain_serializer_function_ser_schema(
                lambda q: q.raw, when_used="always"
            ),
        )

    @classmethod
    def __get_pydantic_json_schema__(
        cls, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "x-kubernetes-int-or-string": True,
            "minimum": 0,
            "pattern": QUANTITY_PATTERN,
            "maxLength": QUANTITY_MAX_LENGTH,
        }
