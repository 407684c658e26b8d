"""Every process a test starts dies with the test runner, however the runner ends.

``install()`` (called once by the root conftest) makes ``subprocess.Popen`` start every
command given as an argument list through :func:`gpushare_sim.run.lifeline.owned`, so the
kernel sends it SIGTERM when the runner ends, SIGKILL included. The cluster's own processes
stop what they started on SIGTERM.
"""

from __future__ import annotations

import subprocess
from typing import Any

from gpushare_sim.run.lifeline import owned

_installed = False


def install() -> None:
    global _installed
    if _installed:
        return
    original = subprocess.Popen.__init__

    def init(self: subprocess.Popen[Any], args: Any, *rest: Any, **kwargs: Any) -> None:
        if isinstance(args, list | tuple) and args and not kwargs.get("shell") and "executable" not in kwargs \
                and "setpriv" not in str(args[0]):  # fmt: skip
            args = owned([str(a) for a in args])
        original(self, args, *rest, **kwargs)

    subprocess.Popen.__init__ = init  # type: ignore[method-assign]
    _installed = True
