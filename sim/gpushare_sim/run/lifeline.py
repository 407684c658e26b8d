"""Nothing outlives its owner: children die with the process that started them.

``owned(argv)`` prefixes a command with util-linux's ``setpriv --pdeathsig``, which asks the
kernel (``PR_SET_PDEATHSIG``) to send the child a signal the moment its parent ends, however
it ends (SIGTERM, SIGKILL, a crash, a timeout), and then execs the command (the setting
survives ``exec``). The local cluster's own processes answer SIGTERM by stopping what they
started (the node simulator its containers and containerd), so a killed runner leaves nothing
behind. ``setpriv`` rather than a ``preexec_fn``: running Python in a forked child of a
multi-threaded parent can deadlock.

The signal follows the *thread* that forked: start children from a thread that lives as
long as they should (the event loop's, or a pool thread, which lives until the pool does).
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence

_SETPRIV = shutil.which("setpriv")


def owned(argv: Sequence[str], signal: str = "TERM") -> list[str]:
    """``argv`` run so that it receives ``signal`` (TERM, KILL, ...) when its parent ends."""
    if _SETPRIV is None:  # util-linux is essential on Debian; elsewhere the child just lives on
        return list(argv)
    return [_SETPRIV, "--pdeathsig", signal, "--", *argv]
