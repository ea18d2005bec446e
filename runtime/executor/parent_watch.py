"""Die with the parent: a child process (the engine core, a background compile) must not
outlive the process that started it, however that one ends (SIGKILL included)."""
from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading

PR_SET_PDEATHSIG = 1


def arm_death_signal() -> None:
    """Have the kernel SIGKILL this process when its parent exits (Linux; elsewhere a
    no-op). Usable as a Popen preexec_fn, so that a child that runs code of its own (a
    background compile) is covered too."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass


def die_with_parent(parent: int) -> None:
    """Exit when `parent` is gone: the kernel's parent-death signal where there is one,
    and a watcher thread that notices re-parenting everywhere."""
    arm_death_signal()
    if os.getppid() != parent:             # it died before the signal was armed
        os._exit(1)
    threading.Thread(target=_watch, args=(parent,), name="parent-watch", daemon=True).start()


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        threading.Event().wait(0.5)
    os._exit(1)
