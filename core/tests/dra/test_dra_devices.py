"""DRA devices of a node (tessera.dra.devices), by table and hypothesis: names, attribute and
capacity keys DRA accepts, shared units consumable and whole ones exclusive, NVLink cliques."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tessera.api.inventory import AdvertisedUnit, GPUInventory
from tessera.api.names import DRA_CAPACITY_CORES, DRA_CAPACITY_MEMORY, MIG_PREFIX, VGPU
from tessera.dra.devices import (
    MAX_KEYS,
    MAX_NAME,
    MIB,
    capacity,
    is_c_identifier,
    is_dns_label,
    node_devices,
    nvlink_cliques,
)
from tessera.mig.catalog import profiles

H100 = "H100-80GB"


def whole_gpu(index: int, *, shares: int = 10, healthy: bool = True,
              peers: tuple[str, ...] = (), numa: int | None = 0) -> GPUInventory:
    uuid = f"GPU-{index:08d}-0000-0000-0000-000000000000"
    return GPUInventory(index=index, uuid=uuid, model=H100, memoryMiB=81559,
                        numaNode=numa, pciBusId=f"00000000:{index + 16:02X}:00.0",
                        nvlinkPeers=peers, units=(AdvertisedUnit(
                            uuid=uuid, resource=VGPU, memoryMiB=81559, shares=shares,
                            healthy=healthy),))


def mig_gpu(index: int, layout: list[tuple[str, int]], *, whole: bool) -> GPUInventory:
    uuid = f"GPU-{index:08d}-0000-0000-0000-000000000000"
    table = {p.name: p for p in profiles(H100)}
    units = tuple(AdvertisedUnit(
        uuid=f"MIG-{index:04d}{start:04d}-0000-0000-0000-000000000000",
        resource=(MIG_PREFIX + name) if whole else VGPU, memoryMiB=table[name].memory_mib,
        shares=0 if whole else 10, profile=name, start=start) for name, start in layout)
    return GPUInventory(index=index, uuid=uuid, model=H100, memoryMiB=81559,
                        migMode="enabled", units=units)


def test_a_shared_gpu_is_one_consumable_device() -> None:
    (d,) = node_devices([whole_gpu(0)])
    assert d["name"] == "gpu0" and d["allowMultipleAllocations"] is True
    memory = d["capacity"][DRA_CAPACITY_MEMORY]
    assert memory["value"] == str(81559 * MIB)
    assert memory["requestPolicy"] == {"default": str(81559 * MIB),
                                       "validRange": {"min": "1Mi", "step": "1Mi"}}
    cores = d["capacity"][DRA_CAPACITY_CORES]
    assert cores == {"value": "100", "requestPolicy": {
        "default": "100", "validRange": {"min": "1", "max": "100", "step": "1"}}}
    a = d["attributes"]
    assert a["model"] == {"string": H100} and a["smCount"] == {"int": 132}
    assert a["mig"] == {"bool": False} and a["numaNode"] == {"int": 0}
    assert "migProfile" not in a and "nvlinkClique" not in a


def test_whole_instances_are_exclusive_and_shared_ones_consumable() -> None:
    whole = node_devices([mig_gpu(1, [("1g.10gb", 0), ("3g.40gb", 4)], whole=True)])
    assert [d["name"] for d in whole] == ["gpu1-mig0-1g10gb", "gpu1-mig4-3g40gb"]
    for d in whole:
        assert "allowMultipleAllocations" not in d
        assert all("requestPolicy" not in c for c in d["capacity"].values())
    assert whole[0]["attributes"]["migProfile"] == {"string": "1g.10gb"}
    assert whole[0]["attributes"]["smCount"] == {"int": 16}
    assert whole[1]["capacity"][DRA_CAPACITY_MEMORY] == {"value": str(40448 * MIB)}
    shared = node_devices([mig_gpu(1, [("1g.10gb+me", 3)], whole=False)])
    assert shared[0]["name"] == "gpu1-mig3-1g10gbme"
    assert shared[0]["allowMultipleAllocations"] is True


def test_what_live_resizes_reserve_is_published_as_less_capacity_of_a_shared_unit() -> None:
    """The scheduler subtracts allocated claims from what is published: a growth beyond a
    claim's allocation is left out of it, so no new claim is placed into that room."""
    (unit,) = whole_gpu(0).units or ()
    left = 81559 * MIB - 2 * (1 << 30)
    got = capacity(unit, (2 * (1 << 30), 10))
    assert got == {
        DRA_CAPACITY_MEMORY: {"value": str(left), "requestPolicy": {
            "default": str(left), "validRange": {"min": "1Mi", "step": "1Mi"}}},
        DRA_CAPACITY_CORES: {"value": "90", "requestPolicy": {
            "default": "90", "validRange": {"min": "1", "max": "90", "step": "1"}}},
    }
    assert capacity(unit) == capacity(unit, (0, 0))
    assert capacity(unit)[DRA_CAPACITY_MEMORY]["value"] == str(81559 * MIB)
    (d,) = node_devices([whole_gpu(0)], {unit.uuid: (2 * (1 << 30), 10)})
    assert d["capacity"] == got
    (d,) = node_devices([whole_gpu(0)], {"GPU-another": (2 * (1 << 30), 10)})
    assert d["capacity"] == capacity(unit)


def test_a_whole_unit_is_published_whole_whatever_is_reserved() -> None:
    whole = mig_gpu(1, [("3g.40gb", 4)], whole=True).units or ()
    assert capacity(whole[0], (1 << 30, 50)) == capacity(whole[0]) == {
        DRA_CAPACITY_MEMORY: {"value": str(40448 * MIB)}, DRA_CAPACITY_CORES: {"value": "100"}}


def test_unhealthy_units_are_withdrawn_and_unknown_units_publish_nothing() -> None:
    assert node_devices([whole_gpu(0, healthy=False)]) == []
    bare = whole_gpu(0).model_copy(update={"units": None})
    assert node_devices([bare]) == []


def test_nvlink_cliques_are_the_linked_components() -> None:
    gpus = [whole_gpu(0), whole_gpu(1), whole_gpu(2), whole_gpu(3)]
    u = [g.uuid for g in gpus]
    gpus[1] = whole_gpu(1, peers=(u[2],))
    gpus[3] = whole_gpu(3, peers=(u[2], "GPU-not-on-this-node"))
    assert nvlink_cliques(gpus) == {u[1]: 1, u[2]: 1, u[3]: 1}
    by_name = {d["name"]: d["attributes"] for d in node_devices(gpus)}
    assert "nvlinkClique" not in by_name["gpu0"]
    assert {by_name[n]["nvlinkClique"]["int"] for n in ("gpu1", "gpu2", "gpu3")} == {1}


LAYOUTS = [[("1g.10gb", s) for s in range(7)], [("3g.40gb", 0), ("3g.40gb", 4)],
           [("2g.20gb", 0), ("2g.20gb", 2), ("1g.10gb", 6)], [("7g.80gb", 0)],
           [("1g.20gb", 0), ("1g.20gb", 2), ("4g.40gb", 4)][:2]]


@st.composite
def nodes(draw: st.DrawFn) -> list[GPUInventory]:
    n = draw(st.integers(0, 8))
    gpus = []
    for i in range(n):
        if draw(st.booleans()):
            gpus.append(whole_gpu(i, shares=draw(st.integers(1, 20)),
                                  healthy=draw(st.booleans() | st.just(True)),
                                  numa=draw(st.none() | st.integers(0, 3))))
        else:
            gpus.append(mig_gpu(i, draw(st.sampled_from(LAYOUTS)), whole=draw(st.booleans())))
    uuids = [g.uuid for g in gpus]
    if len(gpus) > 1:
        links = draw(st.lists(st.tuples(st.sampled_from(uuids), st.sampled_from(uuids)),
                              max_size=6))
        peers: dict[str, set[str]] = {u: set() for u in uuids}
        for a, b in links:
            peers[a].add(b)
        gpus = [g.model_copy(update={"nvlink_peers": tuple(sorted(peers[g.uuid] - {g.uuid}))})
                for g in gpus]
    return gpus


@given(nodes())
def test_every_device_is_one_dra_accepts(gpus: list[GPUInventory]) -> None:
    devices = node_devices(gpus)
    names = [d["name"] for d in devices]
    assert len(names) == len(set(names))
    healthy = [u for g in gpus for u in (g.units or ()) if u.healthy]
    assert len(devices) == len(healthy)
    by_uuid = {u.uuid: u for u in healthy}
    for d in devices:
        assert is_dns_label(d["name"]) and len(d["name"]) <= MAX_NAME
        keys = [*d["attributes"], *d["capacity"]]
        assert len(keys) <= MAX_KEYS and all(is_c_identifier(k) for k in keys)
        for value in d["attributes"].values():
            assert len(value) == 1 and next(iter(value)) in ("string", "int", "bool", "version")
        unit = by_uuid[d["attributes"]["uuid"]["string"]]
        memory = d["capacity"][DRA_CAPACITY_MEMORY]
        assert memory["value"] == str(unit.memory_mib * MIB)
        if unit.shares > 0:
            assert d["allowMultipleAllocations"] is True
            assert all(c["requestPolicy"]["default"] == c["value"]
                       for c in d["capacity"].values())  # omitted: all of it
        else:
            assert "allowMultipleAllocations" not in d


@given(nodes())
def test_linked_gpus_share_a_clique_and_only_they_have_one(gpus: list[GPUInventory]) -> None:
    cliques = nvlink_cliques(gpus)
    index = {g.uuid: g.index for g in gpus}
    for g in gpus:
        for peer in g.nvlink_peers:
            assert cliques[g.uuid] == cliques[peer]
        if g.uuid in cliques:
            assert cliques[g.uuid] <= index[g.uuid]
            assert any(index[u] == cliques[g.uuid] for u in cliques)
        else:
            assert not g.nvlink_peers and not any(g.uuid in o.nvlink_peers for o in gpus)
