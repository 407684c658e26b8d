"""The soak's named profiles (``make soak PROFILE=<name>``): the runs whose figures the README
quotes, each one command.

Every profile runs 2 nodes against a cluster of 3 NATS servers (each node with its leaf
server). ``--borrowers ordinary`` (the default) makes every borrower quick to die;
``--borrowers slow`` makes 60% of them hold 2 GiB, many threads and a child in another
session. A profile sets the soak's defaults: an option given on the command line wins.
"""

from __future__ import annotations

PROFILES: dict[str, dict[str, object]] = {
    # no fault at all: the owner's wait a faulty run is compared with
    "calm": {"minutes": 10.0, "faults": ""},
    # one server of the cluster (the stream leader among them, when there was one) killed every ~12 s
    "nats-member": {"minutes": 5.0, "faults": "nats-member", "fault_every": 12.0},
    # every server of the cluster down for 30 s, twice (at 100 s and about 230 s)
    "nats-outage": {"minutes": 5.0, "faults": "nats-outage", "fault_every": 100.0, "fault_schedule": "regular"},
    # the Kubernetes API server restarted every ~20 s
    "apiserver": {"minutes": 5.0, "faults": "apiserver", "fault_every": 20.0},
}
BORROWERS: dict[str, dict[str, object]] = {
    "ordinary": {"slow_share": 0.0},
    "slow": {"slow_share": 0.6, "borrower_mib": 2048},
}
COMMON: dict[str, object] = {"nodes": 2, "nats_cluster": 3}


def defaults(profile: str, borrowers: str) -> dict[str, object]:
    """The soak's option defaults of ``profile`` with ``borrowers`` (names checked by argparse)."""
    return {**COMMON, **BORROWERS[borrowers], **PROFILES[profile], "label": f"{profile}, {borrowers} borrowers"}
