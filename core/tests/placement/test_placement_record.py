"""The tessera.dev/placement record: dumps/loads round trip and refusals."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tessera.api.names import ANNOTATION_PLACEMENT, VGPU
from tessera.placement.record import PlacementRecord, PlacementRecordError, dumps, loads, of_pod

RESOURCES = st.sampled_from([VGPU, "tessera.dev/mig-1g.10gb", "tessera.dev/mig-3g.40gb"])
UUIDS = st.lists(st.from_regex(r"(GPU|MIG)-[0-9a-f-]{1,12}", fullmatch=True), min_size=1,
                 max_size=4, unique=True).map(tuple)
RECORDS = st.builds(
    PlacementRecord, node=st.from_regex(r"[a-z0-9][a-z0-9.-]{0,20}", fullmatch=True),
    containers=st.dictionaries(st.text(min_size=1, max_size=8),
                               st.dictionaries(RESOURCES, UUIDS, min_size=1), max_size=3))


@given(RECORDS)
def test_round_trip(record: PlacementRecord) -> None:
    assert loads(dumps(record)) == record
    assert dumps(loads(dumps(record))) == dumps(record)


def test_of_pod() -> None:
    record = PlacementRecord("n", {"main": {VGPU: ("GPU-1",)}})
    pod = {"metadata": {"annotations": {ANNOTATION_PLACEMENT: dumps(record)}}}
    assert of_pod(pod) == record
    assert of_pod({"metadata": {}}) is None
    assert record.units() == {"GPU-1"} and record.of("other", VGPU) == ()


@pytest.mark.parametrize(("raw", "message"), [
    ("{", "is not JSON"),
    ("[]", "must be a JSON object"),
    ('{"version":2,"node":"n","containers":{}}', "version 2 is not 1"),
    ('{"version":1,"node":"","containers":{}}', "node must be a node name"),
    ('{"version":1,"node":"n","containers":[]}', "containers must be an object"),
    ('{"version":1,"node":"n","containers":{"c":[]}}', "must map resources to units"),
    ('{"version":1,"node":"n","containers":{"c":{"nvidia.com/gpu":["GPU-1"]}}}',
     "is no tessera GPU resource"),
    ('{"version":1,"node":"n","containers":{"c":{"tessera.dev/vgpu":[]}}}', "must list unit"),
    ('{"version":1,"node":"n","containers":{"c":{"tessera.dev/vgpu":["G","G"]}}}',
     "lists a unit twice"),
])
def test_refusals(raw: str, message: str) -> None:
    with pytest.raises(PlacementRecordError, match=message):
        loads(raw)
