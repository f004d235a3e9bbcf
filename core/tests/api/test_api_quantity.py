"""Quantities mean what Kubernetes says they mean, to the byte."""

from __future__ import annotations

import contextlib
import re
from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.api.quantity import (
    QUANTITY_PATTERN,
    Quantity,
    QuantityError,
    parse_quantity,
)

DEC = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
BIN = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("40Gi", 42949672960),
        ("40960Mi", 42949672960),
        ("42949672960", 42949672960),
        ("1e3", 1000),
        ("1E3", 1000),
        ("1k", 1000),
        ("1E", 10**18),
        ("1.5Gi", 1610612736),
        ("0.5Ki", 512),
        ("100m", Fraction(1, 10)),
        (".5", Fraction(1, 2)),
        ("1.", 1),
        ("1.G", 10**9),
        ("+1", 1),
        ("-1Ki", -1024),
        ("0", 0),
        ("000", 0),
        ("1e-3", Fraction(1, 1000)),
        # Below a nano, Kubernetes rounds non-zero values up (away from zero).
        ("0.1n", Fraction(1, 10**9)),
        ("1.0000000001", Fraction(1000000001, 10**9)),
        ("-0.1n", Fraction(-1, 10**9)),
        # Binary values are capped at the int64 maximum.
        ("8Ei", 2**63 - 1),
        # no digits, where apimachinery's fast path makes them zero
        ("Ti", 0),
        ("+Ki", 0),
        (".", 0),
        ("-", 0),
    ],
)
def test_known_values(text: str, expected: int | Fraction) -> None:
    assert Fraction(parse_quantity(text)[0]) == expected


# apimachinery's own invalid cases (quantity_test.go) and a few more.
@pytest.mark.parametrize(
    "text",
    ["", "1.1.M", "1+1.0M", "0.1mi", "0.1am", "aoeu", ".5i", "1i", "-3.01i", "-3.01e-",
     " 1", "1 ", "1e", "1ee3", "1KiB", "1GB", "1gi", "1K", "1e1.5", "0x10", "1_000",
     # no digits, where apimachinery takes its slow path (found against parse-quantity)
     "Pi", "Ei", ".Pi", "+Ei", "e-10", ".u-1"],
)
def test_kubernetes_rejects(text: str) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(text)


def test_formats() -> None:
    assert parse_quantity("1Gi")[1] == "BinarySI"
    assert parse_quantity("1G")[1] == "DecimalSI"
    assert parse_quantity("1e9")[1] == "DecimalExponent"
    # A binary value below one is reported in decimal, as Kubernetes does.
    assert parse_quantity("0.5Mi")[1] == "BinarySI"


# -- properties ---------------------------------------------------------------------------

digits = st.text("0123456789", min_size=1, max_size=12)
fractions_ = st.one_of(st.just(""), st.text("0123456789", max_size=6).map(lambda s: "." + s)
)
suffixes = st.one_of(
    st.sampled_from(sorted(DEC)),
    st.sampled_from(sorted(BIN)),
    st.tuples(st.sampled_from("eE"), st.sampled_from(["", "+", "-"]), st.integers(0, 30)).map(
        lambda t: f"{t[0]}{t[1]}{t[2]}"
    ),
)


def reference(number: str, suffix: str) -> Fraction:
    """An independent reading of a non-negative quantity: exact rational arithmetic."""
    whole, _, frac = number.partition(".")
    value = Fraction(int(whole or "0")) + (Fraction(int(frac), 10 ** len(frac)) if frac else 0)
    if suffix in BIN:
        value *= 2 ** BIN[suffix]
        binary = True
    else:
        binary = False
        exp = DEC[suffix] if suffix in DEC else int(suffix[1:])
        value *= Fraction(10) ** exp
    nanos = value * 10**9
    if nanos != int(nanos):  # round up to the next nano
        value = Fraction(int(nanos) + 1, 10**9)
    if binary and value > 2**63 - 1:
        value = Fraction(2**63 - 1)
    return value


@settings(max_examples=300)
@given(digits, fractions_, suffixes)
def test_value_matches_reference(whole: str, frac: str, suffix: str) -> None:
    text = whole + frac + suffix
    assert Fraction(parse_quantity(text)[0]) == reference(whole + frac, suffix)
    assert Fraction(parse_quantity("-" + text)[0]) == -reference(whole + frac, suffix)


@given(st.integers(0, 2**40), st.sampled_from(sorted(BIN.items())))
def test_binary_suffix_steps_are_1024(n: int, unit: tuple[str, int]) -> None:
    name, exp = unit
    smaller = {10: "", 20: "Ki", 30: "Mi", 40: "Gi", 50: "Ti", 60: "Pi"}[exp]
    if n * 2**exp <= 2**63 - 1:
        assert parse_quantity(f"{n}{name}")[0] == parse_quantity(f"{n * 1024}{smaller}")[0]


@given(st.integers(0, 10**6), st.sampled_from([("k", ""), ("M", "k"), ("G", "M"), ("T", "G")]))
def test_decimal_suffix_steps_are_1000(n: int, pair: tuple[str, str]) -> None:
    big, small = pair
    assert parse_quantity(f"{n}{big}")[0] == parse_quantity(f"{n * 1000}{small}")[0]
    exp = DEC[big]
    assert parse_quantity(f"{n}{big}")[0] == parse_quantity(f"{n}e{exp}")[0]


@given(st.from_regex(re.compile(QUANTITY_PATTERN), fullmatch=True))
def test_everything_the_crd_pattern_admits_parses(text: str) -> None:
    # The CRD's pattern must never let through a string the parser (and CEL) refuses.
    if len(text) <= 64:
        assert Quantity(text).value >= 0


@given(st.text(max_size=12))
def test_parser_never_crashes(text: str) -> None:
    """Any text either parses to a finite value or is refused with QuantityError."""
    with contextlib.suppress(QuantityError):
        value, _ = parse_quantity(text)
        assert value.is_finite()


def test_quantity_type_compares_by_value_keeps_spelling() -> None:
    assert Quantity("40Gi") == Quantity("40960Mi") == Quantity(42949672960)
    assert Quantity("1G") < Quantity("1Gi")
    assert str(Quantity("40960Mi")) == "40960Mi"
    assert Quantity("1.5Ki").to_bytes() == 1536
    assert Quantity("1m").to_bytes() == 1  # Value() rounds up
    for bad in ("-1Gi", "40GB", "1e1.5", "x" * 65):
        with pytest.raises(QuantityError):
            Quantity(bad)
    assert Quantity(0).value == Decimal(0)
    with pytest.raises(QuantityError):
        Quantity(2**63)  # the API server's JSON integers are int64
