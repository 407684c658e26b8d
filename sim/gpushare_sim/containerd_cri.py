"""containerd's CRI plugin for a private containerd: the shipped ``containerd-gpushare.toml``
drop-in, rendered for one instance (its ``gpushare`` handler's runtime binary, a runc root of the
instance's own) with the settings the instance needs besides (its sandbox image, no CNI
configuration of the host's, sandboxes' OOM score no lower than containerd's own).

containerd 1.x replaces a plugin's whole section with an imported file's, so everything the CRI
plugin is told lives in this one file; :func:`render_drop_in` checks, by reading it back, that
the handler's options took.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

CRI_PLUGIN = "io.containerd.grpc.v1.cri"
CRI_HANDLER = "gpushare"  # the runtime handler the shipped drop-in declares
SHIPPED_DROP_IN = Path(__file__).resolve().parents[2] / "runtime" / "install" / "containerd-gpushare.toml"


class DropInError(ValueError):
    """The drop-in cannot be rendered: not the shape this module knows."""


@dataclass(frozen=True, slots=True)
class CriConfig:
    """containerd's CRI plugin, as a node runs it: the shipped drop-in's handler with this runtime."""

    runtime_binary: Path  # the handler's BinaryName (gpushare-runtime, or runc)
    sandbox_image: str  # the pause image, imported before the first pod (no registry is reachable)
    drop_in: Path = SHIPPED_DROP_IN


def render_drop_in(shipped: str, cri: CriConfig, base: Path) -> str:
    """The shipped drop-in with its handler's BinaryName set and a runc root under ``base``, and
    the instance's own CRI settings after it. containerd 1.x replaces a plugin's whole section
    with an imported file's, so everything the CRI plugin needs lives in this one file."""
    line = re.compile(r'^(?P<indent>[ \t]*)BinaryName[ \t]*=[ \t]*"[^"\n]*"[ \t]*$', re.MULTILINE)
    text, found = line.subn(lambda m: f'{m["indent"]}BinaryName = "{cri.runtime_binary}"\n'
                                      f'{m["indent"]}Root = "{base / "runc"}"', shipped)  # fmt: skip
    if found != 1:
        raise DropInError(f"expected one BinaryName line, found {found}")
    text += (
        f'\n[plugins."{CRI_PLUGIN}"]\n'
        f'  sandbox_image = "{cri.sandbox_image}"\n'
        "  restrict_oom_score_adj = true\n"  # no lower than containerd's own (sandboxes ask -998)
        f'[plugins."{CRI_PLUGIN}".cni]\n'
        f'  conf_dir = "{base / "cni" / "net.d"}"\n'
        f'  bin_dir = "{base / "cni" / "bin"}"\n'
    )
    _check_handler(text, cri, base)
    return text


def _check_handler(text: str, cri: CriConfig, base: Path) -> None:
    try:
        plugin = tomllib.loads(text)["plugins"][CRI_PLUGIN]
        options = plugin["containerd"]["runtimes"][CRI_HANDLER]["options"]
    except (tomllib.TOMLDecodeError, KeyError, TypeError) as err:
        raise DropInError(f"no {CRI_HANDLER} runtime handler in it: {err}") from err
    if options.get("BinaryName") != str(cri.runtime_binary) or options.get("Root") != str(base / "runc"):
        raise DropInError(f"the {CRI_HANDLER} handler's options did not take: {options}")


