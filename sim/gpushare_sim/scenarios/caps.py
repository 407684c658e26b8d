"""Scenario caps: every capped SharePod's real container carries its share's caps.

The sim's ShadowPods of ``share-gpu-3`` and ``share-dev-gpu-4`` carry the fake cards'
isolation profile (``sim_caps``, :mod:`gpushare_sim.fakegpu.vendor`; not MPS, which needs
NVIDIA's driver). The device plugin signs each share's caps (N, the shares it holds, the
card's memory) into Allocate; gpushare-runtime computes the environment from the node's
vendor table and writes it into the container's OCI spec. Each container prints its
environment into its report directory, and the scenario checks, for two share kinds and
sizes, that the caps equal card memory * k / N, the compute share and k/N. A SharePod on a
``share-gpu-2`` ShadowPod stays a soft share: no caps, and the device plugin says so
(``/status``: ``soft share``; ``gpushare_share_isolation{isolation="none"}``).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from gpushare_common.ids import ANN_COMPUTE_PERCENTAGE, ANN_DEVICE_OWNER, ANN_ISOLATION
from gpushare_common.isolation import SOFT_SHARE, SOFT_SHARE_LABEL
from prometheus_client.parser import text_string_to_metric_families

from gpushare_sim.fakegpu import vendor
from gpushare_sim.run.procs import http_json, http_text
from gpushare_sim.scenarios.kit import Scenario, ScenarioError, container, pod_body, scenario, wait_until

# the container's environment and device nodes into its report directory, then wait
REPORT_ENV = ["sh", "-c", "env > /run/gpuload/env; ls -l /dev > /run/gpuload/devs; exec sleep 3600"]
CAPS_ENV = (vendor.MEMORY_ENV, vendor.PERCENT_ENV, vendor.SHARES_ENV)


@dataclass(frozen=True)
class Share:
    pod: str
    resource: str  # without its domain
    k: int  # shares (virtual devices) it asks for
    percent: int | None = None  # its own lower compute share (annotation)

    @property
    def n(self) -> int:
        return int(self.resource.rsplit("-", 1)[1])


CAPPED = (Share("infer-a", "share-gpu-3", 1), Share("infer-b", "share-gpu-3", 1, percent=20),
          Share("dev-two", "share-dev-gpu-4", 2), Share("dev-one", "share-dev-gpu-4", 1))
SOFT = Share("soft", "share-gpu-2", 1)


def share_pod(share: Share) -> dict[str, object]:
    notes = {ANN_COMPUTE_PERCENTAGE: str(share.percent)} if share.percent else {}
    return pod_body(share.pod, [container("main", REPORT_ENV, {f"gpushare/{share.resource}": str(share.k)})],
                    annotations=notes)


async def environment(s: Scenario, name: str) -> tuple[dict[str, str], str, int]:
    """The environment of the pod's container ``main`` as it printed it, its ShadowPod and the card
    memory of its node."""
    pod = await s.wait_running(name, timeout=60)
    path = s.node_dir(pod) / "util" / s.namespace / name / "main" / "env"

    def read() -> str | None:
        try:
            return path.read_text() or None
        except OSError:
            return None

    text = await wait_until(read, 30, f"{name}'s environment", s.cluster)
    env = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    node = next(n for n in s.cluster.nodes if n.name == pod["spec"].get("nodeName"))
    owner = (await wait_until(lambda: _owner(s, name), 30, f"{name}'s device-owner", s.cluster))
    return env, owner, int(node.endpoints["gpu_memory_mib"])


async def _owner(s: Scenario, name: str) -> str | None:
    pod = await s.pod(name)
    return ((pod or {}).get("metadata", {}).get("annotations") or {}).get(ANN_DEVICE_OWNER) or None


async def check_plugin(s: Scenario, resource: str, profile: str, label: str) -> None:
    """The device plugin's /status names the profile (or ``soft share``) of the ShadowPod serving
    ``resource``, and its gauge says the same."""
    child = s.cluster.service("deviceplugin")
    doc = await asyncio.to_thread(http_json, f"{child.http}/status")
    (plugin,) = [p for p in doc["plugins"] if p["resource"] == f"gpushare/{resource}"]
    shown = set(plugin["logic"]["isolation"].values())
    if shown != {label}:
        raise ScenarioError(f"device plugin /status shows {shown} for gpushare/{resource}, expected {label!r}")
    text = await asyncio.to_thread(http_text, f"{child.http}/metrics")
    found = {(sample.labels["resource"], sample.labels["isolation"]): sample.value
             for family in text_string_to_metric_families(text) if family.name == "gpushare_share_isolation"
             for sample in family.samples}  # fmt: skip
    mine = {labels: value for labels, value in found.items() if labels[0] == f"gpushare/{resource}"}
    if mine != {(f"gpushare/{resource}", profile): 1.0}:
        raise ScenarioError(f"gpushare_share_isolation of gpushare/{resource} is {mine}, expected "
                            f"isolation={profile!r} 1")


@scenario("caps")
async def caps(s: Scenario) -> str:
    s.say(f"SharePods on {', '.join(sorted({c.resource for c in CAPPED}))} (profile {vendor.PROFILE}) "
          f"and one on {SOFT.resource} (soft share); each container prints its environment")
    started = time.monotonic()
    for share in (*CAPPED, SOFT):
        await s.create(share_pod(share))
    seen = {share.pod: await environment(s, share.pod) for share in (*CAPPED, SOFT)}
    s.hop(f"{len(seen)} SharePods created -> all running with their environment", time.monotonic() - started)
    for share in CAPPED:
        env, owner, memory = seen[share.pod]
        shadow = await s.shadow_pod(owner.split("/", 1)[1])
        profile = ((shadow or {}).get("metadata", {}).get("annotations") or {}).get(ANN_ISOLATION)
        if profile != vendor.PROFILE:
            raise ScenarioError(f"ShadowPod {owner} of {share.pod} has isolation {profile!r}, "
                                f"expected {vendor.PROFILE!r}")
        expected = vendor.expected_caps(memory, share.n, share.k, share.percent)
        got = {k: env.get(k, "<missing>") for k in expected}
        if got != expected:
            raise ScenarioError(f"{share.pod} ({share.k} of {share.resource}, card {memory} MiB) has caps "
                                f"{got}, expected {expected}")
        s.say(f"{share.pod}: {share.k} of {share.resource} on {owner}", **got)
    soft_env, soft_owner, _ = seen[SOFT.pod]
    leaked = {k: soft_env[k] for k in CAPS_ENV if k in soft_env}
    if leaked:
        raise ScenarioError(f"the soft share {SOFT.pod} on {soft_owner} got caps {leaked}")
    s.say(f"{SOFT.pod}: 1 of {SOFT.resource} on {soft_owner}, a soft share: no caps in its environment")
    for resource in sorted({c.resource for c in CAPPED}):
        await check_plugin(s, resource, vendor.PROFILE, vendor.PROFILE)
    await check_plugin(s, SOFT.resource, SOFT_SHARE, SOFT_SHARE_LABEL)
    s.say("device plugin: /status and gpushare_share_isolation name each resource's profile, "
          f"{SOFT_SHARE_LABEL!r} for {SOFT.resource}")
    return (f"{len(CAPPED)} capped SharePods on 2 share kinds see card memory * k / N, their compute share "
            "and k/N; the soft share sees none")
