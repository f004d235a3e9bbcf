"""Who writes each tessera.dev/ key: one table, complete, read by the webhook, the chart's
policies and docs/operator.md."""

from __future__ import annotations

from pathlib import Path

from tessera.api import names, writers
from tessera_operator.webhooks import policy
from tessera_operator.webhooks.config import POD_MATCH_EXPRESSION

ROOT = Path(__file__).resolve().parents[3]
KEY_PREFIXES = ("ANNOTATION_", "LABEL_", "FINALIZER_", "SCHEDULING_GATE_")
BEGIN = "<!-- tessera keys: generated from core/tessera/api/writers.py, do not edit -->"
END = "<!-- end of tessera keys -->"


def test_every_key_tessera_defines_is_classified_once() -> None:
    defined = {getattr(names, n) for n in dir(names) if n.startswith(KEY_PREFIXES)}
    listed = [k.name for k in writers.KEYS]
    assert len(listed) == len(set(listed))
    assert set(listed) == defined
    for k in writers.KEYS:
        assert k.writers, k.name


def test_a_user_writes_only_the_resize_request_and_placement_policies_on_a_pod() -> None:
    assert [k.name for k in writers.KEYS if k.on == "Pod" and k.user_writable] == [
        names.ANNOTATION_BUDGET_REQUEST, names.ANNOTATION_NODE_POLICY,
        names.ANNOTATION_GPU_POLICY, names.ANNOTATION_GPU_MODELS,
        names.ANNOTATION_GPU_MODELS_EXCLUDE, names.ANNOTATION_GPU_UUIDS_EXCLUDE,
        names.ANNOTATION_GPU_TOPOLOGY]
    assert set(writers.tessera_only_pod_keys("annotation")) == {
        names.ANNOTATION_BUDGET, names.ANNOTATION_CLAIM_BUDGET, names.ANNOTATION_BUDGET_RESIZE,
        names.ANNOTATION_PLACEMENT}
    assert set(writers.tessera_only_pod_keys("label")) == {
        names.LABEL_BUDGETED, names.LABEL_GROWTH_OF, names.LABEL_CLAIM_OF}


def test_the_webhook_sees_every_pod_carrying_a_key_only_tessera_writes() -> None:
    for kind in ("annotation", "label"):
        for key in writers.tessera_only_pod_keys(kind):  # type: ignore[arg-type]
            assert f"'{key}'" in POD_MATCH_EXPRESSION


def test_the_charts_policies_are_rendered_from_the_table() -> None:
    path = ROOT / "charts" / "tessera" / "templates" / "budget-protection.yaml"
    assert path.read_text() == policy.render(), "run `make policies`"
    text = policy.pod_budget_policy()
    for kind in ("annotation", "label"):
        for key in writers.tessera_only_pod_keys(kind):  # type: ignore[arg-type]
            assert f"'{key}'" in text
    assert names.ANNOTATION_BUDGET_REQUEST + "'" not in text


def test_docs_list_every_key_and_who_writes_it() -> None:
    doc = (ROOT / "docs" / "operator.md").read_text()
    assert BEGIN in doc and END in doc, "docs/operator.md lost its keys table markers"
    table = doc.split(BEGIN, 1)[1].split(END, 1)[0].strip() + "\n"
    assert table == writers.markdown_table(), (
        "docs/operator.md's keys table is stale: paste writers.markdown_table()")
