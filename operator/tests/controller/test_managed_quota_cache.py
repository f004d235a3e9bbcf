"""The leader's copy of the managed ResourceQuotas follows their watch, and the answer of a
write that raced a delete does not bring a deleted one back: otherwise every later pass
patches an object that is gone (404) instead of creating it again, and a GPUQuota deleted
and made again under the same name never gets its ResourceQuota (seen in a full run: a
second "narrow" quota never became Degraded)."""

from __future__ import annotations

from typing import Any

from tessera_operator.controller.quotas import QuotaController

NS, RQ = "team-a", "gpuquota-narrow"


def rq(rv: int, uid: str = "old") -> dict[str, Any]:
    return {"metadata": {"namespace": NS, "name": RQ, "resourceVersion": str(rv), "uid": uid,
                         "annotations": {"tessera.dev/gpuquota": "narrow"}}}


def controller() -> QuotaController:
    c = QuotaController(kube=None, cache=None, pods=None)  # type: ignore[arg-type]
    c.on_managed("SYNC", {"items": [rq(10)]})
    return c


def test_a_write_answered_after_the_delete_event_does_not_bring_it_back() -> None:
    c = controller()
    c.on_managed("DELETED", rq(12))  # the release let it go; the watch saw it deleted
    c._remember((NS, RQ), rq(11))  # the release's own answer, arriving after that
    assert (NS, RQ) not in c.managed  # the next pass creates it, instead of patching


def test_a_new_object_by_the_same_name_is_remembered() -> None:
    c = controller()
    c.on_managed("DELETED", rq(12))
    c._remember((NS, RQ), rq(20, uid="new"))  # created again
    assert c.managed[(NS, RQ)]["metadata"]["uid"] == "new"
    c.on_managed("DELETED", rq(25, uid="new"))
    c.on_managed("ADDED", rq(30, uid="newer"))  # the watch's own copy clears the guard
    c._remember((NS, RQ), rq(31, uid="newer"))
    assert c.managed[(NS, RQ)]["metadata"]["resourceVersion"] == "31"


def test_an_answer_older_than_the_watchs_copy_is_not_kept() -> None:
    c = controller()
    c.on_managed("MODIFIED", rq(15))
    c._remember((NS, RQ), rq(14))
    assert c.managed[(NS, RQ)]["metadata"]["resourceVersion"] == "15"
