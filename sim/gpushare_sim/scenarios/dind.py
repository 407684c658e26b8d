"""Scenario 1, Dind: a dev pod whose ``dind`` container sees the card of its ``main`` container.

``main`` requests one card; ``dind`` requests nothing and carries the
annotation ``container-devices-from.dind: _/_/main``. The gpushare runtime
copies main's device entries into dind's OCI spec before dind is created, so
both real containers have the same device node.
"""

from __future__ import annotations

import time

from gpushare_common.ids import ANN_DEVICES_FROM

from gpushare_sim.scenarios.kit import GPU, LIST_DEVICES, Scenario, ScenarioError, container, pod_body, scenario


@scenario("dind")
async def dind(s: Scenario) -> str:
    mode = "real containers" if all(n.containerd for n in s.cluster.nodes) else "plain processes"
    s.say(f"dev pod: main asks for {GPU}: 1, dind asks for nothing and copies main's devices ({mode})")
    body = pod_body("devbox", [container("main", LIST_DEVICES, {GPU: "1"}), container("dind", LIST_DEVICES)],
                    annotations={f"{ANN_DEVICES_FROM}dind": "_/_/main"})  # fmt: skip
    started = time.monotonic()
    await s.create(body)
    main = await s.devices_seen("devbox", "main", timeout=60)
    dind = await s.devices_seen("devbox", "dind", timeout=30)
    s.hop("dev pod created -> both containers running with the card", time.monotonic() - started)
    s.say("device nodes seen", main=",".join(main), dind=",".join(dind))
    if len(main) != 1 or main != dind:
        raise ScenarioError(f"main and dind should see the same single card: main={main} dind={dind}")
    return f"main and dind both see {main[0]}"
