"""What a GPU pod may not ask for (it would go around its budget), and the seccomp profile it
gets when it names none."""

from __future__ import annotations

from typing import Any

import pytest

from tessera_operator.webhooks.pod_security import problems, refusal, seccomp_patch


def spec(pod_sc: dict[str, Any] | None = None, **container_sc: Any) -> dict[str, Any]:
    c: dict[str, Any] = {"name": "main"}
    if container_sc:
        c["securityContext"] = container_sc
    out: dict[str, Any] = {"containers": [c], "initContainers": [{"name": "init"}]}
    if pod_sc is not None:
        out["securityContext"] = pod_sc
    return out


@pytest.mark.parametrize(("s", "says"), [
    (spec(privileged=True), "container 'main' is privileged"),
    (spec(capabilities={"add": ["SYS_ADMIN"]}), "adds capability SYS_ADMIN"),
    (spec(capabilities={"add": ["CAP_SYS_ADMIN"]}), "adds capability CAP_SYS_ADMIN"),
    (spec(capabilities={"add": ["all"]}), "adds capability all"),
    (spec(procMount="Unmasked"), "unmasked /proc"),
    (spec(seccompProfile={"type": "Unconfined"}), "container 'main' has seccompProfile"),
    (spec({"seccompProfile": {"type": "Unconfined"}}), "spec.securityContext.seccompProfile"),
])
def test_what_would_go_around_a_budget_is_refused_saying_what_and_why(
        s: dict[str, Any], says: str) -> None:
    found = problems(s)
    assert len(found) == 1 and says in found[0], found
    assert "not allowed in a pod with a GPU budget" in refusal(found)


def test_ordinary_hardening_and_other_capabilities_pass() -> None:
    assert problems(spec(privileged=False, capabilities={"add": ["NET_BIND_SERVICE"],
                                                        "drop": ["ALL"]},
                         procMount="Default", seccompProfile={"type": "RuntimeDefault"})) == []
    assert problems(spec({"seccompProfile": {"type": "Localhost",
                                             "localhostProfile": "x.json"}})) == []
    assert problems({"containers": [{"name": "a", "securityContext": None}]}) == []


def test_a_pod_naming_no_seccomp_profile_gets_runtime_default() -> None:
    assert seccomp_patch(spec()) == [{"op": "add", "path": "/spec/securityContext",
                                      "value": {"seccompProfile": {"type": "RuntimeDefault"}}}]
    assert seccomp_patch(spec({"runAsNonRoot": True})) == [{
        "op": "add", "path": "/spec/securityContext/seccompProfile",
        "value": {"type": "RuntimeDefault"}}]
    # a profile named anywhere is its author's choice
    assert seccomp_patch(spec({"seccompProfile": {"type": "RuntimeDefault"}})) == []
    assert seccomp_patch(spec(seccompProfile={"type": "Localhost",
                                              "localhostProfile": "x.json"})) == []
