"""Every process of a job ends with it: the supervisor is their child subreaper, and ends what its job left behind.

A process group is not enough: a job that runs `setsid cmd &` or daemonizes (a double fork) leaves it, and would
keep its GPUs (CUDA_VISIBLE_DEVICES) after the job ended. So the supervisor makes itself the child subreaper
(prctl PR_SET_CHILD_SUBREAPER, unprivileged, Linux >= 3.4) before it starts the job: an orphan of the job is then
reparented to the supervisor, not to init, and every process of the job stays a descendant of the supervisor,
which /proc shows. Once the job's main process has ended, `end_descendants` signals them all until none remains.

What it does not cover: a supervisor killed by SIGKILL leaves its descendants to init (a cgroup of the agent's own
would catch those too). Standard library only, and cheap to import: the supervisor imports it at each job's start.
"""

from __future__ import annotations

import os
import signal
import time

PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
POLL_S = 0.02  # how often it looks again while descendants remain


def become_subreaper() -> bool:
    """Make this process the child subreaper of its descendants; whether it could (Linux only)."""
    # `_ctypes` and three small classes, not `ctypes`, whose import would cost each supervisor's start ~3 ms more.
    try:
        from _ctypes import FUNCFLAG_CDECL, FUNCFLAG_USE_ERRNO, CFuncPtr, _SimpleCData, dlopen
    except ImportError:
        return False

    class _Int(_SimpleCData):
        _type_ = "i"

    class _Function(CFuncPtr):
        _flags_ = FUNCFLAG_CDECL | FUNCFLAG_USE_ERRNO
        _restype_ = _Int

    class _Libc:
        _handle = dlopen(None)  # type: ignore[arg-type]  # None: the program's own symbols, libc's among them

    try:
        prctl = _Function(("prctl", _Libc))  # type: ignore[arg-type]  # any object with a `_handle` will do
    except AttributeError:  # no prctl in this C library: not Linux
        return False
    return prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def descendants(root: int) -> list[int]:
    """The pids of every process whose chain of parents leads to `root`, from /proc (zombies included)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:  # gone meanwhile
            continue
        # `pid (comm) state ppid ...`: the command name may hold spaces and parentheses, so split after the last `)`.
        ppid = int(stat[stat.rindex(b")") + 2:].split(None, 2)[1])
        children.setdefault(ppid, []).append(int(name))
    found, todo = [], list(children.get(root, ()))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, ()))
    return found


def reap_children(keep: int | None = None) -> bool:
    """Collect every child of this process that has ended (orphans reparented here), except `keep` (the job's
    main process, which `subprocess` waits for itself); whether a child is left, running or `keep`."""
    while True:
        try:  # WNOWAIT: look which child it is before collecting it
            ended = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:  # no child at all
            return False
        if ended is None or ended.si_pid == keep:
            return True
        os.waitpid(ended.si_pid, 0)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def end_descendants(grace_s: float) -> None:
    """SIGTERM every descendant of this process, SIGKILL those left after `grace_s`; return once none remains.

    Called once the job's main process has been collected, so that every child it collects is an orphan."""
    me = os.getpid()
    kill_at = time.monotonic() + grace_s
    termed: set[int] = set()
    while True:
        # Each process left has a chain of parents up to a child of this one (its first, the job's main process,
        # is collected): no child, nothing left, and no need to read all of /proc, the common case.
        if not reap_children():
            return
        left = descendants(me)
        killing = time.monotonic() >= kill_at
        for pid in left:
            if killing:
                _signal(pid, signal.SIGKILL)
            elif pid not in termed:
                termed.add(pid)
                _signal(pid, signal.SIGTERM)
                _signal(pid, signal.SIGCONT)  # a stopped process acts on its SIGTERM only once continued
        time.sleep(POLL_S)
