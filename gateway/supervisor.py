"""Workers of ``serve --workers N`` die with their supervisor (``serve.py`` exports its pid)."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

# The process id of ``serve --workers N``'s supervisor, for its workers.
SUPERVISOR_ENV = "GATEWAY_SUPERVISOR_PID"
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def exit_with_supervisor() -> None:
    """In a worker of ``serve --workers N``: be killed when the supervisor dies.

    A replica killed with SIGKILL (an OOM kill, a node lost, ``kill -9``) must be gone
    whole: workers that outlived it would go on serving and owning their runs, which
    other replicas then cannot take over (ARCHITECTURE.md section 5). On Linux the
    kernel sends the worker SIGKILL when its parent dies (``PR_SET_PDEATHSIG``);
    elsewhere a thread watches the parent. A supervisor that exits in order (SIGTERM)
    drains its workers first, as uvicorn does, so this fires only when it could not.
    """
    supervisor = os.environ.get(SUPERVISOR_ENV)
    if not supervisor or not supervisor.isdigit() or int(supervisor) == os.getpid():
        return  # not a worker of a supervisor: the supervisor itself, or one process
    if sys.platform == "linux":
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    else:
        threading.Thread(target=_watch_parent, args=(int(supervisor),), daemon=True).start()
    if os.getppid() != int(supervisor):  # it died before the signal was armed
        os.kill(os.getpid(), signal.SIGKILL)


def _watch_parent(supervisor: int) -> None:
    while os.getppid() == supervisor:
        time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)
