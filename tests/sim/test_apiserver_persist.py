"""The emulator restarted with its state file: objects, versions and token keys survive; a watch
from before the restart gets 410 and re-lists; a broken state file is a clear error."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpushare_sim.apiserver import persist
from gpushare_sim.apiserver.kinds import BY_PATH
from gpushare_sim.apiserver.namespaces import bootstrap
from gpushare_sim.apiserver.store import Store

PODS = BY_PATH[("", "v1", "pods")]


def pod(name: str, node: str) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default", "uid": name},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]}}


def test_objects_versions_and_the_signing_key_survive(tmp_path: Path) -> None:
    first = Store()
    bootstrap(first)
    first.put(PODS, ("default", "a"), pod("a", "n1"))
    first.put(PODS, ("default", "b"), pod("b", "n2"))
    state = tmp_path / "state.json"
    persist.dump(first, state)
    second = Store()
    assert persist.load(second, state) == sum(len(t) for t in first.objects.values())
    assert second.rv == first.rv and second.signing_key == first.signing_key
    assert second.get(PODS, ("default", "a")).obj["spec"]["nodeName"] == "n1"  # type: ignore[union-attr]
    assert [k for k, _ in second._on_node["pods"]["n2"].items()] == [("default", "b")]
    bootstrap(second)  # the namespaces exist: nothing more is created
    assert second.rv == first.rv
    second.put(PODS, ("default", "c"), pod("c", "n1"))
    assert second.rv == first.rv + 1  # versions go on, never back


@pytest.mark.parametrize("text", ["", "{}", '{"rv": 1, "signing_key": {"secret": "zz"}, "objects": {}}',
                                  '{"rv": 1, "signing_key": {"secret": "00", "key_id": "k"}, "objects": {"x": []}}'])
def test_a_broken_state_file_is_a_clear_error(tmp_path: Path, text: str) -> None:
    state = tmp_path / "state.json"
    state.write_text(text)
    with pytest.raises(persist.StateError, match=r"state\.json"):
        persist.load(Store(), state)
