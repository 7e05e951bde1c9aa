"""Child-process hygiene for the server's scheduler, detokenizer and HTTP worker processes: they ignore Ctrl-C
(the launcher shuts them down in order), die with their parent, and can tell it or a sibling is gone."""
from __future__ import annotations

import ctypes
import os
import signal

PR_SET_PDEATHSIG, PR_SET_NAME = 1, 15


def child_process_setup(name: str) -> None:
    """Call first in a child: SIGINT and SIGTERM ignored (a signal to the whole process group, as Ctrl-C or
    `timeout` send, must not end it before the launcher's ordered shutdown); SIGKILL when the parent dies
    (Linux). An HTTP worker's uvicorn installs its own handlers."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        libc.prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)   # shows in ps/top
    except OSError:
        pass                                                   # not Linux: parent_alive() still works


def parent_alive(parent_pid: int) -> bool:
    """False once the parent `parent_pid` is gone (this process was re-parented)."""
    return os.getppid() == parent_pid


def process_alive(pid: int) -> bool:
    """False once process `pid` has exited (a zombie not yet reaped counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        pass
    try:
        os.kill(pid, 0)                                         # not Linux, or no /proc: signal 0
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
