"""A Job's ``podFailurePolicy`` evaluated on a failed pod the way the Job controller does
(kubernetes pkg/controller/job, ``matchPodFailurePolicy``): rules in order, the first that
matches decides; ``onExitCodes`` looks at terminated containers with a non-zero exit code,
``onPodConditions`` at the pod's conditions by type and status (a pattern's status defaults to
True, as the API server defaults it). A rule with an unknown action is skipped. None: no rule
matched (the failure counts towards ``backoffLimit``)."""

from __future__ import annotations

from typing import Any

ACTIONS = ("Ignore", "Count", "FailJob", "FailIndex")


def matched_action(policy: dict[str, Any], pod: dict[str, Any]) -> str | None:
    status = pod.get("status") or {}
    for rule in policy.get("rules", []):
        if rule["action"] not in ACTIONS:
            continue
        if "onExitCodes" in rule and _exit_code_matches(status, rule["onExitCodes"]):
            return str(rule["action"])
        if "onPodConditions" in rule and _condition_matches(status, rule["onPodConditions"]):
            return str(rule["action"])
    return None


def _condition_matches(status: dict[str, Any], patterns: list[dict[str, Any]]) -> bool:
    return any(c.get("type") == p["type"] and c.get("status") == p.get("status", "True")
               for c in status.get("conditions") or [] for p in patterns)


def _exit_code_matches(status: dict[str, Any], requirement: dict[str, Any]) -> bool:
    for container in [*(status.get("containerStatuses") or []), *(status.get("initContainerStatuses") or [])]:
        terminated = (container.get("state") or {}).get("terminated")
        if terminated is None or terminated.get("exitCode", 0) == 0:
            continue
        if requirement.get("containerName") not in (None, container.get("name")):
            continue
        within = terminated["exitCode"] in requirement["values"]
        if within == (requirement["operator"] == "In"):
            return True
    return False


# the policy Kubernetes' documentation gives for a Job that retries disruptions and fails on a bug
IGNORE_DISRUPTIONS = {"rules": [
    {"action": "FailJob", "onExitCodes": {"containerName": "main", "operator": "In", "values": [42]}},
    {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
]}
