"""The Node selector behaves like metav1.LabelSelector."""

from __future__ import annotations

import pytest

from tessera.api import LabelSelector

SEL = LabelSelector.model_validate({
    "matchLabels": {"tessera.dev/gpu.product": "H100-80GB"},
    "matchExpressions": [
        {"key": "pool", "operator": "In", "values": ["a", "b"]},
        {"key": "cordon", "operator": "DoesNotExist"},
        {"key": "zone", "operator": "NotIn", "values": ["z9"]},
        {"key": "rack", "operator": "Exists"},
    ],
})


@pytest.mark.parametrize(
    ("labels", "selected"),
    [
        ({"tessera.dev/gpu.product": "H100-80GB", "pool": "a", "rack": "1"}, True),
        ({"tessera.dev/gpu.product": "H100-80GB", "pool": "c", "rack": "1"}, False),
        ({"tessera.dev/gpu.product": "A100-80GB", "pool": "a", "rack": "1"}, False),
        ({"tessera.dev/gpu.product": "H100-80GB", "pool": "a", "rack": "1", "cordon": ""}, False),
        ({"tessera.dev/gpu.product": "H100-80GB", "pool": "a", "rack": "1", "zone": "z9"}, False),
        ({"tessera.dev/gpu.product": "H100-80GB", "pool": "a"}, False),
    ],
)
def test_matches(labels: dict[str, str], selected: bool) -> None:
    assert SEL.matches(labels) is selected


def test_empty_selects_everything() -> None:
    assert LabelSelector.model_validate({}).matches({"any": "thing"})

