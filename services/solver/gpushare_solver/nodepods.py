"""The node's pods as the solver reads them: each decoded once, right after the API call, by
:func:`gpushare_common.pods.read_pod`. A pod that does not decode is logged with its key and
why, and left out; its key is kept so that what the solver holds for it is not dropped."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpushare_common.logging import get_logger
from gpushare_common.pods import UNKNOWN, Pod, PodError, PodRules, read_pod

log = get_logger("solver.pods")


@dataclass(frozen=True, slots=True)
class NodePods:
    pods: list[Pod]
    malformed: list[PodError]

    def present(self) -> set[str]:
        """The pods that exist and are not finished; one that does not decode counts as present
        (nothing says it finished), so the cache entries it may have are kept."""
        return {p.key for p in self.pods if not p.finished} | {e.pod for e in self.malformed if e.pod != UNKNOWN}


def read_pods(docs: Iterable[Mapping[str, Any]], rules: PodRules, node: str) -> NodePods:
    pods: list[Pod] = []
    malformed: list[PodError] = []
    for doc in docs:
        try:
            pods.append(read_pod(doc, rules))
        except PodError as err:
            log.warning("pod does not decode; skipped", node=node, pod=err.pod, reason=err.reason)
            malformed.append(err)
    return NodePods(pods, malformed)
