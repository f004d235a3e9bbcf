"""Which pod and container a process belongs to, from /proc/<pid>/cgroup as the kubelet's
two cgroup drivers, cgroup v1 and v2 and nested runtimes lay it out."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tessera_node.device.cgroups import CgroupOwner, ConflictingCgroups, cgroup_owner

UID = "2f1e0b7c-51a3-4c53-9d3e-0c2b9a8f7e61"
CID = "a" * 60 + "beef"


@pytest.mark.parametrize(("text", "want"), [
    # cgroup v1, cgroupfs driver: every hierarchy names the container
    (f"12:pids:/kubepods/besteffort/pod{UID}/{CID}\n"
     f"4:memory:/kubepods/besteffort/pod{UID}/{CID}\n", CgroupOwner(UID, CID)),
    # guaranteed QoS: no class level
    (f"0::/kubepods/pod{UID}/{CID}\n", CgroupOwner(UID, CID)),
    # systemd driver, containerd (UID with underscores)
    (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
     f"{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n", CgroupOwner(UID, CID)),
    (f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/docker-{CID}.scope\n",
     CgroupOwner(UID, CID)),
    (f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod"
     f"{UID.replace('-', '_')}.slice/crio-{CID}.scope\n", CgroupOwner(UID, CID)),
    # a kind node: the kubelet's tree below the node container's own
    (f"0::/system.slice/docker-{'b' * 64}.scope/kubelet.slice/kubelet-kubepods.slice/"
     f"kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod"
     f"{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n", CgroupOwner(UID, CID)),
    # the pod's own cgroup (a process moved there, or the sandbox): pod known, container not
    (f"0::/kubepods/besteffort/pod{UID}\n", CgroupOwner(UID, None)),
    # v1 hierarchies that name only the pod do not disagree with one naming the container
    (f"3:cpuset:/kubepods/besteffort/pod{UID}\n12:pids:/kubepods/besteffort/pod{UID}/{CID}\n",
     CgroupOwner(UID, CID)),
    # host processes, a plain container outside Kubernetes
    ("0::/user.slice/user-0.slice/session-1.scope\n", None),
    (f"0::/system.slice/docker-{CID}.scope\n", None),
    ("12:pids:/\n4:memory:/process_api/825326f77c9ce85621715920e738fe7e\n", None),
    ("", None),
    ("garbage without colons\n", None),
])
def test_owner_from_cgroup_file(text: str, want: CgroupOwner | None) -> None:
    assert cgroup_owner(text) == want


def test_hierarchies_naming_two_pods_are_not_trusted() -> None:
    other = "11111111-2222-3333-4444-555555555555"
    text = f"12:pids:/kubepods/pod{UID}/{CID}\n4:memory:/kubepods/pod{other}/{CID}\n"
    with pytest.raises(ConflictingCgroups, match=other):
        cgroup_owner(text)
    with pytest.raises(ConflictingCgroups):
        cgroup_owner(f"12:pids:/kubepods/pod{UID}/{CID}\n4:memory:/kubepods/pod{UID}/"
                     f"{'c' * 64}\n")


hexs = st.text(alphabet="0123456789abcdef", min_size=1, max_size=12)


@given(st.uuids(), st.text(alphabet="0123456789abcdef", min_size=64, max_size=64),
       st.lists(hexs, max_size=3), st.sampled_from(["cgroupfs", "systemd"]),
       st.sampled_from(["", "besteffort", "burstable"]))
def test_any_prefix_and_layout_names_the_pod(uid: object, cid: str, prefix: list[str],
                                             driver: str, qos: str) -> None:
    u = str(uid)
    if driver == "cgroupfs":
        tail = f"kubepods/{qos + '/' if qos else ''}pod{u}/{cid}"
    else:
        q = f"-{qos}" if qos else ""
        tail = (f"kubepods.slice/kubepods{q}.slice/kubepods{q}-pod{u.replace('-', '_')}.slice/"
                f"cri-containerd-{cid}.scope")
    path = "/" + "/".join([*prefix, tail])
    assert cgroup_owner(f"0::{path}\n") == CgroupOwner(u, cid)
