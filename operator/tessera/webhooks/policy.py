"""The chart's ValidatingAdmissionPolicies that keep tessera's pod keys tessera's, rendered
from :mod:`tessera.api.writers` (``charts/tessera/templates/budget-protection.yaml``;
``make policies`` writes it, a test fails when it is stale).

They run inside the API server (CEL): they hold while the operator is down and cost pod
writes no webhook round trip.  Three policies:

* ``tessera-pod-budget`` -- pods: at create, no key the webhook does not write itself
  (a resize's outcome, a growth holder's label or gate, a holder's name); after admission,
  every key only tessera writes stays as it is, unless its writer changes it (the operator;
  tessera-node for a resize's outcome, only on pods bound to its own node);
* ``tessera-growth-holders`` -- a growth holder is changed, deleted or evicted by tessera
  and the garbage and namespace collectors only: it holds a resize's growth in the count;
* ``tessera-pod-templates`` -- workloads that stamp pods (Deployments, ReplicaSets,
  StatefulSets, DaemonSets, Jobs, CronJobs, ReplicationControllers, PodTemplates) may not
  add a key only tessera writes to their pod template: a clear error at ``kubectl apply``
  instead of a key silently removed from every pod (kube-controller-manager's own copies,
  e.g. a Deployment's ReplicaSet, pass).
"""

from __future__ import annotations

from tessera.api.names import GROWTH_HOLDER_PREFIX, PREFIX, SCHEDULING_GATE_GROWTH
from tessera.api.writers import KEYS, NODE, Key

OPERATOR_USER = "system:serviceaccount:{{ .Release.Namespace }}:{{ .Values.serviceAccount.name }}"
NODE_USER = ("system:serviceaccount:{{ .Release.Namespace }}:"
             "{{ .Values.nodeDaemon.serviceAccount.name }}")
COLLECTORS = ("system:serviceaccount:kube-system:generic-garbage-collector",
              "system:serviceaccount:kube-system:namespace-controller",
              "system:kube-controller-manager")
"""Who else may delete a growth holder: the garbage collector (its pod is gone) and the
namespace controller (its namespace is), with or without their own credentials."""
TEMPLATE_COPIERS = ("system:serviceaccount:kube-system:deployment-controller",
                    "system:serviceaccount:kube-system:cronjob-controller",
                    "system:kube-controller-manager")

WIDTH = 96


def _fold(text: str, indent: int) -> str:
    """A folded YAML scalar (``>-``), never breaking inside a Helm ``{{ … }}``."""
    words: list[str] = []
    for part in text.split(" "):
        if words and words[-1].count("{{") > words[-1].count("}}"):
            words[-1] += " " + part
        else:
            words.append(part)
    pad = " " * indent
    lines, line = [], ""
    for w in words:
        if line and len(pad) + len(line) + 1 + len(w) > WIDTH:
            lines.append(line)
            line = w
        else:
            line = f"{line} {w}" if line else w
    lines.append(line)
    return ">-\n" + "\n".join(pad + ln for ln in lines)


def _rule(expression: str, message: str, indent: int = 6, message_expression: bool = False
          ) -> str:
    pad = " " * (indent - 2)
    field = "messageExpression" if message_expression else "message"
    return (f"{pad}- expression: {_fold(expression, indent + 2)}\n"
            f"{pad}  {field}: {_fold(message, indent + 2)}\n"
            f"{pad}  reason: Forbidden\n")


def _policy(name: str, comment: str, spec: str) -> str:
    """A ValidatingAdmissionPolicy (``spec``: its lines under ``spec:``, indented by two) and
    the binding that denies what it refuses."""
    head = "".join(f"# {line}\n" for line in comment.splitlines())
    return f"""{head}apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: {name}
  labels:
    app.kubernetes.io/name: tessera
spec:
  failurePolicy: Fail
{spec}---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: {name}
  labels:
    app.kubernetes.io/name: tessera
spec:
  policyName: {name}
  validationActions: [Deny]
"""


def _pod_keys() -> list[Key]:
    return [k for k in KEYS if k.on == "Pod" and not k.user_writable
            and k.kind in ("annotation", "label")]


def _section(k: Key) -> str:
    return "annotations" if k.kind == "annotation" else "labels"


def _unchanged(k: Key) -> str:
    var = "Annotations" if k.kind == "annotation" else "Labels"
    return (f"variables.old{var}[?'{k.name}'].orValue('') == "
            f"variables.new{var}[?'{k.name}'].orValue('')")


def _carries_a_key() -> str:
    """Whether the pod (as it is, or as it was) carries anything this policy judges: most
    pods carry none, and skip the validations (the API server's cost of a pod write)."""
    def keyed(obj: str) -> str:
        return " || ".join(
            f"{obj}.metadata.?{section}.orValue({{}}).exists(k, k.startsWith('{PREFIX}'))"
            for section in ("annotations", "labels"))
    return (f"{keyed('object')} || (oldObject != null && ({keyed('oldObject')})) || "
            f"object.metadata.?name.orValue('').startsWith('{GROWTH_HOLDER_PREFIX}') || "
            f"object.spec.?schedulingGates.orValue([]).exists(g, "
            f"g.name == '{SCHEDULING_GATE_GROWTH}')")


def pod_budget_policy() -> str:
    rules = []
    for k in _pod_keys():
        if not k.at_admission:
            rules.append(_rule(
                f"request.operation != 'CREATE' || !('{k.name}' in "
                f"variables.new{'Annotations' if k.kind == 'annotation' else 'Labels'})",
                f"metadata.{_section(k)}[{k.name}] is written only by tessera ({k.what}): "
                f"remove it from the pod"))
        writers = [w for w in (NODE,) if w in k.writers]
        allowed = f"request.userInfo.username == '{NODE_USER}' || " if writers else ""
        rules.append(_rule(
            f"request.operation != 'UPDATE' || {allowed}{_unchanged(k)}",
            f"metadata.{_section(k)}[{k.name}] is written only by tessera and cannot be "
            f"changed ({k.what})" + (f": {k.instead}" if k.instead else "")))
        if NODE in k.writers:
            rules.append(_rule(
                f"request.operation != 'UPDATE' || request.userInfo.username != "
                f"'{NODE_USER}' || {_unchanged(k)} || (has(request.userInfo.extra) && "
                f"'authentication.kubernetes.io/node-name' in request.userInfo.extra && "
                f"request.userInfo.extra['authentication.kubernetes.io/node-name'] == "
                f"[object.spec.?nodeName.orValue('')])",
                f"tessera-node writes metadata.{_section(k)}[{k.name}] only on a pod bound "
                f"to its own node, with a token bound to its pod"))
    rules.append(_rule(
        f"request.operation != 'CREATE' || (!object.metadata.?name.orValue('').startsWith("
        f"'{GROWTH_HOLDER_PREFIX}') && !object.spec.?schedulingGates.orValue([]).exists(g, "
        f"g.name == '{SCHEDULING_GATE_GROWTH}'))",
        f"pods named {GROWTH_HOLDER_PREFIX}… or gated by {SCHEDULING_GATE_GROWTH} are "
        f"tessera's growth holders: only the operator creates them"))
    return _policy("tessera-pod-budget", (
        "What admission writes on a GPU pod, and what records a live resize, is tessera's,\n"
        "never the pod owner's (operator/tessera/api/writers.py; generated by "
        "`make policies`)."), f"""  matchConstraints:
    resourceRules:
      - apiGroups: [""]
        apiVersions: ["v1"]
        operations: ["CREATE", "UPDATE"]
        resources: ["pods", "pods/status"]
  matchConditions:
    - name: not-the-operator
      expression: >-
        request.userInfo.username != '{OPERATOR_USER}'
    - name: carries-a-tessera-key
      expression: {_fold(_carries_a_key(), 8)}
  variables:
    - name: oldAnnotations
      expression: "oldObject == null ? {{}} : oldObject.metadata.?annotations.orValue({{}})"
    - name: newAnnotations
      expression: "object.metadata.?annotations.orValue({{}})"
    - name: oldLabels
      expression: "oldObject == null ? {{}} : oldObject.metadata.?labels.orValue({{}})"
    - name: newLabels
      expression: "object.metadata.?labels.orValue({{}})"
  validations:
{"".join(rules)}""")


def growth_holders_policy() -> str:
    allowed = ", ".join(f"'{u}'" for u in (OPERATOR_USER, *COLLECTORS))
    return "---\n" + _policy("tessera-growth-holders", (
        "A growth holder holds a live resize's growth in the namespace's ResourceQuotas:\n"
        "deleting, evicting or ungating it would free quota the resized pod still uses."),
        f"""  matchConstraints:
    resourceRules:
      - apiGroups: [""]
        apiVersions: ["v1"]
        operations: ["UPDATE", "DELETE"]
        resources: ["pods"]
      - apiGroups: [""]
        apiVersions: ["v1"]
        operations: ["CREATE"]
        resources: ["pods/eviction"]
  matchConditions:
    - name: a-growth-holder
      expression: "request.?name.orValue('').startsWith('{GROWTH_HOLDER_PREFIX}')"
    - name: not-tessera-or-a-collector
      expression: {_fold(f"!(request.userInfo.username in [{allowed}])", 8)}
  validations:
{_rule("false", "'pod ' + request.name + ' is a growth holder: it holds the growth of a live "
       "resize in the GPUQuota count and goes with its pod; only tessera changes or deletes it'",
       message_expression=True)}""")


def pod_templates_policy() -> str:
    keys = _pod_keys()
    listed = {kind: ", ".join(f"'{k.name}'" for k in keys if k.kind == kind)
              for kind in ("annotation", "label")}
    copiers = ", ".join(f"'{u}'" for u in TEMPLATE_COPIERS)

    def meta(obj: str) -> str:
        return (f"request.resource.resource == 'cronjobs' ? "
                f"{obj}.?spec.?jobTemplate.?spec.?template.?metadata.orValue({{}}) : "
                f"request.resource.resource == 'podtemplates' ? "
                f"{obj}.?template.?metadata.orValue({{}}) : "
                f"{obj}.?spec.?template.?metadata.orValue({{}})")

    def added(section: str, kind: str) -> str:
        return (f"variables.meta.?{section}.orValue({{}}).filter(k, k in [{listed[kind]}] && "
                f"variables.oldMeta.?{section}.orValue({{}})[?k].orValue('') != "
                f"variables.meta.?{section}.orValue({{}})[k])")
    return "---\n" + _policy("tessera-pod-templates", (
        "Workloads that stamp pods may not add a key only tessera writes to their pod template\n"
        "(the webhook would remove it from every pod): refused at apply, with the keys named."),
        f"""  matchConstraints:
    resourceRules:
      - apiGroups: ["apps"]
        apiVersions: ["v1"]
        operations: ["CREATE", "UPDATE"]
        resources: ["deployments", "replicasets", "statefulsets", "daemonsets"]
      - apiGroups: ["batch"]
        apiVersions: ["v1"]
        operations: ["CREATE", "UPDATE"]
        resources: ["jobs", "cronjobs"]
      - apiGroups: [""]
        apiVersions: ["v1"]
        operations: ["CREATE", "UPDATE"]
        resources: ["replicationcontrollers", "podtemplates"]
  matchConditions:
    - name: not-a-controller-copying-a-template
      expression: {_fold(f"!(request.userInfo.username in [{copiers}])", 8)}
  variables:
    - name: meta
      expression: {_fold(meta("object"), 8)}
    - name: oldMeta
      expression: {_fold("oldObject == null ? {} : (" + meta("oldObject") + ")", 8)}
    - name: added
      expression: {_fold(added("annotations", "annotation") + " + " + added("labels", "label"),
                         8)}
  validations:
{_rule("size(variables.added) == 0",
       "'the pod template carries ' + variables.added.join(', ') + ': written only by "
       "tessera; remove it (tessera removes it from every pod it admits)'",
       message_expression=True)}""")


def render() -> str:
    """``charts/tessera/templates/budget-protection.yaml``."""
    return pod_budget_policy() + growth_holders_policy() + pod_templates_policy()


def main() -> None:  # pragma: no cover - `make policies`
    import sys
    sys.stdout.write(render())


if __name__ == "__main__":  # pragma: no cover
    main()
