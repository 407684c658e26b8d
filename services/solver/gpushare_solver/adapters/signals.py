"""Signal a container's init process directly, race-free, when this process can see it.

containerd's Kill runs ``runc kill`` (a process start per container), which
under load takes tens of milliseconds. When the solver shares the host's pid
namespace, the init process of a task (its pid from containerd) can be sent
SIGKILL at once: a pidfd pins the process, ``/proc/<pid>/cgroup`` must name
the container, then the signal goes through the pidfd, so a recycled pid is
never hit. Killing the init of a container's pid namespace ends every process
in it; containerd's own Kill still follows for the rest.
"""

from __future__ import annotations

import os
import signal


def kill_init(pid: int, container_id: str) -> bool:
    """SIGKILL the container's init if ``pid`` is still that container's; True when sent."""
    if pid <= 0 or not container_id:
        return False
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return False  # gone, not visible from here, or not allowed
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8") as handle:
            if container_id not in handle.read():
                return False
        signal.pidfd_send_signal(fd, signal.SIGKILL)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
