"""A service's command line: ``--help`` answers before the service's code is imported.

``service_main`` parses the arguments with only the settings struct (``--help`` lists every
setting it reads, generated from it) and the app module's docstring, read from its source
without running it; only then are the service's modules (FastAPI, nats-py, the kubernetes
package: about 1.5 s of CPU) imported, by ``build``. What it does next is
:func:`gpushare_common.tasks.start_service`.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from .settings import describe

if TYPE_CHECKING:
    from .tasks import ServiceMain

S = TypeVar("S")


def docstring_of(module: str) -> str:
    """The docstring of ``module`` read from its source (nothing of it runs); "" when unreadable."""
    try:
        spec = importlib.util.find_spec(module)
        if spec is None or not spec.origin:
            return ""
        return ast.get_docstring(ast.parse(Path(spec.origin).read_text(encoding="utf-8"))) or ""
    except (ImportError, OSError, SyntaxError, ValueError):
        return ""


def service_main(name: str, settings: type[S], build: Callable[[S], ServiceMain], about: str | None = "",
                 argv: Sequence[str] | None = None) -> int:  # fmt: skip
    """A service's entry point: ``--help`` lists every setting ``settings`` reads; then the
    settings are read from the environment once, logging set up, and ``build(settings)`` (which
    imports the service and reads whatever else it needs, such as its keys) returns the service's
    ``main(stop)``. A bad setting prints one line that names the variable and what it expects, and
    exits 2 before anything starts; so does a Kubernetes configuration that cannot be used."""
    parser = argparse.ArgumentParser(prog=f"gpushare-{name}", description=(about or "").strip().split("\n\n")[0],
                                     epilog=describe(settings), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.parse_args(argv)
    from .tasks import start_service

    return start_service(name, settings, build)
