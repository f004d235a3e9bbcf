"""tessera's quantity parser against Kubernetes' own: ``resource.ParseQuantity`` from the
apimachinery the control plane is built with (``e2e/controlplane/cmd/parse-quantity``).

Every string the GPUQuota CRD schema accepts must mean to tessera exactly what it means to
the API server and CEL: the same exact value, the same bytes, the same MiB in admission and
recount.  And any text must be refused by both parsers or by neither.
"""

from __future__ import annotations

import math
import re
import subprocess
from collections.abc import Iterator
from decimal import Decimal, localcontext
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tessera.api.quantity import (
    QUANTITY_MAX_LENGTH,
    QUANTITY_PATTERN,
    QuantityError,
    parse_quantity,
    to_bytes,
)
from tessera_operator.quota.units import count, memory_mib

ROOT = Path(__file__).resolve().parents[3]
CRD = ROOT / "crds" / "gpuquotas.tessera.dev.yaml"

Answer = tuple[Decimal, int | None] | None
"""Kubernetes' reading: (exact value, Value()) or None when it refuses the text."""


def kubernetes(binary: Path, texts: list[str]) -> list[Answer]:
    out = subprocess.run([str(binary)], input="".join(t + "\n" for t in texts),
                         capture_output=True, text=True, timeout=60, check=True).stdout
    answers: list[Answer] = []
    for line in out.splitlines():
        if line.startswith("error "):
            answers.append(None)
            continue
        _, unscaled, scale, value, _canonical = line.split(" ", 4)
        with localcontext() as ctx:
            ctx.prec, ctx.Emax, ctx.Emin = 1000, 10**9, -(10**9)
            exact = Decimal(unscaled).scaleb(-int(scale))
        answers.append((exact, None if value == "-" else int(value)))
    assert len(answers) == len(texts), out
    return answers


def _quantity_schemas(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        if node.get("x-kubernetes-int-or-string") and "pattern" in node:
            yield node
        for v in node.values():
            yield from _quantity_schemas(v)
    elif isinstance(node, list):
        for v in node:
            yield from _quantity_schemas(v)


def test_every_quantity_field_of_the_crd_uses_the_one_pattern() -> None:
    schemas = list(_quantity_schemas(yaml.safe_load(CRD.read_text())))
    assert len(schemas) >= 4  # hard, default, max memory; used and reservations memory
    assert {(s["pattern"], s["maxLength"]) for s in schemas} == {
        (QUANTITY_PATTERN, QUANTITY_MAX_LENGTH)}


TRICKY = [
    "10000000000000m",  # the 10 GB: a regular expression called it "no limit"
    "0", "000", "1", "+1", ".5", "1.", "1.G", "0.1n", "1.0000000001", "1m", "999m",
    "40Gi", "40960Mi", "1.5Gi", "0.5Ki", "7Ei", "8Ei", "9Ei", "1E", "1e99", "1E-99",
    "123456789012345678901234567890", "9223372036854775807", "9223372036854775808",
    "18446744073709551616Mi", ".000000000000000001", "1e-9", "1e-10", "0.0000000015",
]


def _check(binary: Path, texts: list[str]) -> None:
    for text, answer in zip(texts, kubernetes(binary, texts), strict=True):
        assert answer is not None, f"the API server refuses {text!r}, the CRD accepts it"
        exact, value = answer
        assert parse_quantity(text)[0] == exact, text
        if value is not None and 0 <= exact < 2**63:
            assert to_bytes(text) == value, text
        assert memory_mib(text) == math.ceil(exact / 2**20), text
        if exact == exact.to_integral_value():
            assert count(text) == exact, text
        else:
            with pytest.raises(QuantityError):
                count(text)


def test_tricky_spellings_mean_what_kubernetes_says(parse_quantity_reference: Path) -> None:
    assert all(re.fullmatch(QUANTITY_PATTERN, t) for t in TRICKY)
    _check(parse_quantity_reference, TRICKY)


crd_strings = st.from_regex(re.compile(QUANTITY_PATTERN), fullmatch=True).filter(
    lambda t: len(t) <= QUANTITY_MAX_LENGTH)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(crd_strings, min_size=1, max_size=150))
def test_every_string_the_crd_accepts_parses_to_kubernetes_value(
        parse_quantity_reference: Path, texts: list[str]) -> None:
    _check(parse_quantity_reference, texts)


def _same_answers(binary: Path, texts: list[str]) -> None:
    texts = [t for t in texts if t]  # one per line: no empty lines
    if not texts:
        return
    for text, answer in zip(texts, kubernetes(binary, texts), strict=True):
        try:
            mine: Decimal | None = parse_quantity(text)[0]
        except QuantityError:
            mine = None
        assert mine == (None if answer is None else answer[0]), text


DIGITLESS = ["Pi", "Ei", "Ti", "Ki", ".Pi", ".Ki", "+Ei", "-", "+", ".", "+.", "m", "n", "e-9",
             "e-10", "E", "k", "+.e5"]


def test_both_parsers_refuse_the_same_digitless_texts(parse_quantity_reference: Path) -> None:
    _same_answers(parse_quantity_reference, DIGITLESS)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.text("0123456789.+-eEinumkKMGTP ", max_size=8), min_size=1, max_size=150))
def test_both_parsers_refuse_the_same_texts(parse_quantity_reference: Path,
                                            texts: list[str]) -> None:
    _same_answers(parse_quantity_reference, texts)
