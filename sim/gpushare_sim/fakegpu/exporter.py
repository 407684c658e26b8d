"""A DCGM-style exporter for the fake cards (Prometheus text format).

Per card: ``DCGM_FI_DEV_GPU_UTIL``, ``DCGM_FI_DEV_FB_USED``,
``DCGM_FI_DEV_FB_FREE`` (MiB) and ``DCGM_FI_DEV_POWER_USAGE`` (W), labelled
like dcgm-exporter: ``gpu``, ``UUID``, ``device``, ``modelName``,
``Hostname``, and ``container``/``namespace``/``pod`` of the container the
kubelet gave the card to (from the pod-resources API, device plugins' devices first, then
gpushare's DRA claims; empty when free).

Utilisation comes from the workload program's reports
(``<node dir>/util/<namespace>/<pod>/<container>/nvidia<i>.json``): a card's
utilisation is the sum of its fresh reports (every container using it,
owners and borrowers alike), capped at 100.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
from gpushare_common import dra
from gpushare_common.adapters.kubeletapi import podresources_v1_pb2 as pr
from gpushare_common.adapters.kubeletapi import podresources_v1_pb2_grpc as pr_grpc

from gpushare_sim.fakegpu.cards import VENDOR_RESOURCE, FakeCard, device_name, index_of_device_name

MODEL_NAME = "gpushare Fake GPU"
IDLE_POWER_W = 50.0
MAX_POWER_W = 250.0
MIN_FRESH_S = 2.0

Owner = tuple[str, str, str]  # namespace, pod, container


@dataclass(frozen=True, slots=True)
class Report:
    namespace: str
    pod: str
    container: str
    card: int
    util: int
    mem_mib: int
    ts: float
    every_ms: int

    def fresh(self, now: float) -> bool:
        return now - self.ts <= max(MIN_FRESH_S, 3 * self.every_ms / 1000)


def parse_report(text: str, where: tuple[str, str, str]) -> Report | None:
    """One report file's content; None for anything malformed."""
    try:
        body = json.loads(text)
        card = index_of_device_name(str(body["dev"]))
        util, mem = int(body["util"]), int(body.get("mem_mib", 0))
        ts, every = float(body["ts"]), int(body.get("every_ms", 1000))
    except (ValueError, KeyError, TypeError):
        return None
    if card is None or not 0 <= util <= 100 or mem < 0 or every <= 0:
        return None
    return Report(*where, card=card, util=util, mem_mib=mem, ts=ts, every_ms=every)


def read_reports(util_dir: Path) -> Iterator[Report]:
    for path in util_dir.glob("*/*/*/nvidia*.json"):
        container_dir = path.parent
        where = (container_dir.parent.parent.name, container_dir.parent.name, container_dir.name)
        try:
            report = parse_report(path.read_text(), where)
        except OSError:
            continue
        if report is not None:
            yield report


async def card_owners(socket: Path) -> dict[str, Owner]:
    """Device ID -> container that holds it, from the kubelet's pod-resources API."""
    owners: dict[str, Owner] = {}
    try:
        async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
            stub = pr_grpc.PodResourcesListerStub(channel)
            resp = await stub.List(pr.ListPodResourcesRequest(), timeout=5)
    except grpc.RpcError:
        return owners
    for pod in resp.pod_resources:
        for container in pod.containers:
            for devices in container.devices:
                if devices.resource_name == VENDOR_RESOURCE:
                    for device_id in devices.device_ids:
                        owners[device_id] = (pod.namespace, pod.name, container.name)
            for card in _claimed_cards(container):
                owners.setdefault(card, (pod.namespace, pod.name, container.name))
    return owners


def _claimed_cards(container: pr.ContainerResources) -> list[str]:
    """Cards a container holds through gpushare's DRA claims (their CDI devices)."""
    found = []
    for claim in container.dynamic_resources:
        for resource in claim.claim_resources:
            for cdi in resource.cdi_devices:
                try:
                    found.append(dra.parse_cdi_device(cdi.name).card)
                except dra.DraNameError:
                    continue
    return found


def _labels(node: str, card: FakeCard, owner: Owner | None) -> str:
    ns, pod, container = owner or ("", "", "")
    pairs = {
        "gpu": str(card.index), "UUID": card.device_id, "device": device_name(card.index),
        "modelName": MODEL_NAME, "Hostname": node,
        "container": container, "namespace": ns, "pod": pod,
    }  # fmt: skip
    return ",".join(f'{k}="{_escape(v)}"' for k, v in pairs.items())


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


METRICS = (
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
)


def render(
    node: str,
    cards: list[FakeCard],
    reports: list[Report],
    owners: dict[str, Owner],
    total_mib: int,
    now: float | None = None,
) -> str:
    moment = time.time() if now is None else now
    fresh = [r for r in reports if r.fresh(moment)]
    values: dict[str, list[tuple[str, float]]] = {name: [] for name, _, _ in METRICS}
    for card in cards:
        mine = [r for r in fresh if r.card == card.index]
        util = min(100, sum(r.util for r in mine))
        used = min(total_mib, sum(r.mem_mib for r in mine))
        labels = _labels(node, card, owners.get(card.device_id))
        values["DCGM_FI_DEV_GPU_UTIL"].append((labels, util))
        values["DCGM_FI_DEV_FB_USED"].append((labels, used))
        values["DCGM_FI_DEV_FB_FREE"].append((labels, total_mib - used))
        power = IDLE_POWER_W + (MAX_POWER_W - IDLE_POWER_W) * util / 100
        values["DCGM_FI_DEV_POWER_USAGE"].append((labels, power))
    lines: list[str] = []
    for name, kind, help_text in METRICS:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        lines += [f"{name}{{{labels}}} {_number(v)}" for labels, v in values[name]]
    return "\n".join(lines) + "\n"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.3f}"


class Exporter:
    """Builds the metrics page on every scrape."""

    def __init__(self, node: str, node_dir: Path, cards: list[FakeCard], total_mib: int,
                 pod_resources: Path) -> None:  # fmt: skip
        self.node = node
        self.util_dir = node_dir / "util"
        self.cards = cards
        self.total_mib = total_mib
        self.pod_resources = pod_resources

    async def scrape(self) -> str:
        owners = await card_owners(self.pod_resources)
        return render(self.node, self.cards, list(read_reports(self.util_dir)), owners,
                      self.total_mib)  # fmt: skip
