"""The dra scenario's unchanged pods: one SharePod spec on a DRA node and on a device-plugin node.

The spec asks ``gpushare/share-gpu-4: 1`` and nothing else. On the device-plugin node a
ShadowPod's virtual devices serve it; on the DRA node, whose allocatable has no such resource,
the scheduler gives each pod a claim of the class ``share-gpu-4.gpushare.k8s.io`` (its
``extendedResourceName``, KEP-5004), recorded in the pod's ``extendedResourceClaimStatus``, and
the driver's slot device of a card serves it, with the share's caps. On each node the two pods
share one card.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from gpushare_common import dra

from gpushare_sim.fakegpu import vendor
from gpushare_sim.run.cluster import Node
from gpushare_sim.scenarios.kit import Scenario, ScenarioError, container, pod_body
from gpushare_sim.scenarios.spot import pinned

REPORT = ["sh", "-c", "ls -l /dev > /run/gpuload/devs; env > /run/gpuload/env; exec sleep 3600"]
RESOURCE = "gpushare/share-gpu-4"
Env = Callable[[Scenario, Node, str], Awaitable[str]]


def sharepod(name: str, node: str) -> dict[str, Any]:
    """The one spec: a SharePod of a quarter card, pinned to ``node`` (the rest is unchanged)."""
    return pinned(pod_body(name, [container("main", REPORT, {RESOURCE: "1"})]), node)


async def unchanged(s: Scenario, dra_node: Node, env: Env) -> str:
    plugin_node = next(n for n in s.cluster.nodes if not n.dra)
    started = time.monotonic()
    names = {dra_node.name: ["same-dra-1", "same-dra-2"], plugin_node.name: ["same-dp-1", "same-dp-2"]}
    for node, pods in names.items():
        for name in pods:
            await s.create(sharepod(name, node))
    seen = {name: await s.devices_seen(name, timeout=90) for pods in names.values() for name in pods}
    s.hop("one SharePod spec, 2 pods on each node -> all running", time.monotonic() - started)
    for node, (first, second) in names.items():
        if len(seen[first]) != 1 or seen[first] != seen[second]:
            raise ScenarioError(f"the two SharePods on {node} should share one card, saw {seen[first]} and "
                                f"{seen[second]}")
    claims = [await _served(s, name) for name in names[dra_node.name]]
    s.say(f"{', '.join(names[dra_node.name])} on the DRA node share {seen['same-dra-1'][0]} through claims "
          f"{', '.join(c for c, _ in claims)} ({claims[0][1]}); {', '.join(names[plugin_node.name])} share "
          f"{seen['same-dp-1'][0]} through a ShadowPod")
    text = set((await env(s, dra_node, "same-dra-1")).splitlines())
    expected = vendor.expected_caps(int(dra_node.endpoints["gpu_memory_mib"]), dra.DEFAULT_SHARES,
                                    dra.DEFAULT_SHARES // 4)
    caps = {f"{k}={v}" for k, v in expected.items()}
    if not caps <= text:
        raise ScenarioError(f"same-dra-1 (a quarter through DRA) should carry its caps {sorted(caps)}, "
                            f"has {sorted(text)}")
    for pods in names.values():
        for name in pods:
            await s.delete(name)
    for pods in names.values():
        for name in pods:
            await s.wait_gone(name)
    return f"{RESOURCE} served on both nodes, each pair on one card"


async def _served(s: Scenario, name: str) -> tuple[str, str]:
    """The pod's special claim and the slot device its allocation names."""
    pod = await s.pod(name) or {}
    status = (pod.get("status") or {}).get("extendedResourceClaimStatus") or {}
    mappings = status.get("requestMappings") or []
    if not status.get("resourceClaimName") or [m.get("resourceName") for m in mappings] != [RESOURCE]:
        raise ScenarioError(f"{name} on the DRA node should have its {RESOURCE} in extendedResourceClaimStatus, "
                            f"has {status}")
    claim = await s.kube.get_resource_claim(s.namespace, status["resourceClaimName"])
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    if "-s4" not in result["device"]:
        raise ScenarioError(f"{name}'s claim should hold a share-gpu-4 slot, holds {result['device']}")
    return str(status["resourceClaimName"]), str(result["device"])
