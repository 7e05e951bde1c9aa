"""Child-process hygiene for the server's scheduler and detokenizer processes: they ignore Ctrl-C
(the HTTP process shuts them down in order), die with their parent, and can tell it is gone."""
from __future__ import annotations

import ctypes
import os
import signal

PR_SET_PDEATHSIG, PR_SET_NAME = 1, 15


def child_process_setup(name: str) -> None:
    """Call first in a child: SIGINT ignored; SIGKILL when the parent dies (Linux)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        libc.prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)   # shows in ps/top
    except OSError:
        pass                                                   # not Linux: parent_alive() still works


def parent_alive(parent_pid: int) -> bool:
    """False once the parent `parent_pid` is gone (this process was re-parented)."""
    return os.getppid() == parent_pid
