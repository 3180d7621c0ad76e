"""The job's process, as the supervisor (supervise.py) starts and waits for it: the part of `subprocess.Popen` it uses.

Not `subprocess` itself: with what it imports (locale, re, enum, threading, selectors) that is ~15 ms of CPU of
what was a supervisor's ~35 ms start, paid once per job. The supervisor runs no thread, so a plain fork is safe here.
The command starts as `Popen(argv, env=, cwd=, stdin=DEVNULL, start_new_session=True, user=, group=,
extra_groups=, umask=)` starts it, in the same order in the child (chdir, umask, signals back to their defaults,
setsid, groups, gid, uid, exec), with the same OSError in the parent when it cannot start. Linux.
"""

from __future__ import annotations

import errno
import os
import select
import signal
import time

# What Python ignores that a command must not inherit ignored (Popen's restore_signals).
_RESTORED = ("SIGPIPE", "SIGXFZ", "SIGXFSZ")


class JobProcess:
    """A started command: its pid (also its process group and session) and, once it ended, its exit code."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None  # negative: killed by that signal, as Popen's
        try:  # a descriptor that becomes readable when the process ends (Linux 5.3)
            self._pidfd: int | None = os.pidfd_open(pid)
        except (AttributeError, OSError):
            self._pidfd = None  # an older kernel: wait() polls, as Popen.wait with a timeout does

    def end(self) -> int:
        """Its exit code, once it ended: waits as long as it runs."""
        code = self.returncode
        while code is None:  # once: waitpid without WNOHANG returns when it ended
            code = self._reaped(os.waitpid(self.pid, 0))
        return code

    def wait(self, timeout: float) -> int | None:
        """Its exit code once it ended; None if it still runs after `timeout` seconds."""
        if self.returncode is not None:
            return self.returncode
        deadline = time.monotonic() + timeout
        if self._pidfd is not None:
            select.select([self._pidfd], [], [], timeout)  # an interrupting signal's handler runs, then it goes on
            return self._reaped(os.waitpid(self.pid, os.WNOHANG))
        delay = 0.0005
        while (code := self._reaped(os.waitpid(self.pid, os.WNOHANG))) is None:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            time.sleep(min(delay, left))
            delay = min(delay * 2, 0.05)
        return code

    def _reaped(self, waited: tuple[int, int]) -> int | None:
        pid, status = waited
        if pid == 0:
            return None
        self.returncode = os.waitstatus_to_exitcode(status)
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        return self.returncode


def _exec(paths: list[str], argv: list[str], env: dict[str, str]) -> None:
    """Run the first of `paths` that can run; else the error of the first that exists, or that it is found nowhere."""
    first: OSError | None = None
    missing: OSError = FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT))
    for path in paths:
        try:
            os.execve(path, argv, env)  # noqa: S606  (the job's own command, as Popen would run it)
        except (FileNotFoundError, NotADirectoryError) as exc:
            missing = exc
        except OSError as exc:
            first = first or exc
    raise first or missing


def start(argv: list[str], env: dict[str, str], cwd: str | None, uid: int | None, gid: int | None,
          groups: list[int] | None, umask: int) -> JobProcess:
    """Start `argv` in a session of its own, stdin /dev/null, stdout and stderr this process's; OSError if it cannot."""
    # Where to look for it, as Popen does in the parent: in the child, after the switch to the job's user, Python may
    # no longer read its own library (os.execvpe imports `warnings`).
    name = argv[0]
    paths = [name] if os.path.dirname(name) else [os.path.join(d, name) for d in env.get("PATH", os.defpath).split(":")]
    # Closed by the command's exec (Python opens every descriptor non-inheritable); else it carries why it failed.
    errors_out, errors_in = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: it must never return into the supervisor's code
        try:
            os.close(errors_out)
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            if cwd is not None:
                os.chdir(cwd)
            if umask >= 0:
                os.umask(umask)
            for signame in _RESTORED:
                if hasattr(signal, signame):
                    signal.signal(getattr(signal, signame), signal.SIG_DFL)
            os.setsid()
            if groups is not None:
                os.setgroups(groups)
            if gid is not None:
                os.setregid(gid, gid)
            if uid is not None:
                os.setreuid(uid, uid)
            _exec(paths, argv, env)
        except BaseException as exc:  # noqa: BLE001  (whatever it is, the parent reports it; the child only exits)
            number = exc.errno if isinstance(exc, OSError) and exc.errno else 0
            strerror = exc.strerror if isinstance(exc, OSError) and exc.strerror else repr(exc)
            os.write(errors_in, f"{number}:{strerror}".encode(errors="replace"))
        finally:
            os._exit(255)
    os.close(errors_in)
    try:
        failed = b""
        while chunk := os.read(errors_out, 4096):  # EOF once the command runs (exec) or the child wrote why not
            failed += chunk
    finally:
        os.close(errors_out)
    if failed:
        os.waitpid(pid, 0)
        failed_errno, _, strerror = failed.decode(errors="replace").partition(":")
        raise OSError(int(failed_errno), strerror)
    return JobProcess(pid)
