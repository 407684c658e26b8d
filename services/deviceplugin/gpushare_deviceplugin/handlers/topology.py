"""Which cards to give a container that asks for several: together first, then idle first.

Cards under one PCIe root complex talk to each other fastest (peer-to-peer without crossing
the CPU interconnect), and a NUMA node is the next best thing, so a request for ``need``
cards is served from one group (the PCIe root, or the NUMA node when the root is unknown)
when some group can serve it whole; among those groups, the one whose best ``need`` cards
rank best (idle before lent before unhealthy), then the group already holding the request's
must-include cards, then the group of the first card by name. When no group can, the best-ranked cards overall.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

Rank = Callable[[str], int]  # 0 best; equal ranks keep the devices' name order


def prefer_together(candidates: Sequence[str], need: int, group_of: Callable[[str], str], rank: Rank,
                    must_include: Sequence[str] = ()) -> list[str]:
    ordered = sorted(candidates, key=lambda d: (rank(d), d))
    if need <= 0:
        return []
    groups: dict[str, list[str]] = {}
    for device in ordered:
        group = group_of(device)
        if group:
            groups.setdefault(group, []).append(device)
    held = {group_of(d) for d in must_include}
    fitting = [(tuple(rank(d) for d in members[:need]), group not in held, members[0], group)
               for group, members in groups.items() if len(members) >= need]
    if not fitting:
        return ordered[:need]
    return groups[min(fitting)[3]][:need]
