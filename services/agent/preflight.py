"""What a job needs before it starts, checked in its own process as its user: that its folder can be entered and
its program found and run. Where not, the reason names the job's user, the path and the folder in the way, and the
fix: "job user nobody (uid 65534) cannot run /root/.venv/bin/python: /root is 0700; …".

The supervisor (supervise.py) calls `folder` and `program` in the job's process after the switch to its user and
before the exec, so `os.access` answers for that user. Standard library only, and little of it: it runs once per
job start.
"""

from __future__ import annotations

import os
import stat

# The fixes a failure names, by who the job runs as.
FIX_OTHER_USER = ("set WHALEFLUX_JOB_USER (or WHALEFLUX_JOB_USERS per team) to a user who can,"
                  " or install it where the job user can read")
FIX_OWN_USER = "let that user pass through and read it (chmod), or name one it can"
FIX_NOT_FOUND = ("name the program by its full path, or put its folder first on the agent's PATH"
                 " (`whaleflux up` puts its own environment's bin there)")


def describe(user: str | None) -> str:
    """'job user NAME (uid N)' for `user` (a name or uid, as Spec.user holds it; None: this process's own)."""
    import pwd

    if user is None:
        uid = os.getuid()
    elif user.isdigit():
        uid = int(user)
    else:
        uid = pwd.getpwnam(user).pw_uid
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = f"whaleflux-{uid}"  # a pool uid /etc/passwd does not name (jobuser.environment's name for it)
    return f"job user {name} (uid {uid})"


def blocked(path: str) -> str | None:
    """Why this process cannot reach `path`'s folder: the first folder on the way it cannot pass through
    ('/root is 0700') or that does not exist ('/x does not exist'); None when it can reach it."""
    folder = os.path.dirname(os.path.abspath(path))
    ancestors = []
    while True:
        ancestors.append(folder)
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    for folder in reversed(ancestors):
        try:
            st = os.stat(folder)
        except FileNotFoundError:
            return f"{folder} does not exist"
        except OSError as exc:
            return f"{folder}: {exc.strerror}"
        if not stat.S_ISDIR(st.st_mode):
            return f"{folder} is not a folder"
        if not os.access(folder, os.X_OK):
            return f"{folder} is {stat.S_IMODE(st.st_mode):04o}, owner uid {st.st_uid}"
    return None


def _runnable(path: str) -> str | None:
    """Why this process cannot run the file `path` (or the interpreter its `#!` line names); None when it can."""
    why = blocked(path)
    if why is not None:
        return why
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "no such file"
    except OSError as exc:
        return exc.strerror or str(exc)
    if stat.S_ISDIR(st.st_mode):
        return "it is a folder"
    if not os.access(path, os.X_OK):
        return f"{path} is {stat.S_IMODE(st.st_mode):04o}, owner uid {st.st_uid}: not executable by it"
    try:
        with open(path, "rb") as fh:
            head = fh.read(256)
    except OSError:
        return None  # run-only (--x): the kernel runs a binary it cannot read; a script then fails on its own
    if head.startswith(b"#!"):
        words = head[2:].split(b"\n", 1)[0].split()
        interpreter = os.fsdecode(words[0]) if words else ""
        if interpreter.startswith("/"):
            why = _runnable(interpreter) if interpreter != path else None
            if why is not None:
                return f"its interpreter {interpreter}: {why}"
    return None


def program(argv0: str, search: list[str], who: str, switched: bool) -> str | None:
    """Why `who` cannot run the command's program `argv0` (a path, or a name looked up in the folders `search`, its
    PATH), with the fix; None when it can."""
    fix = FIX_OTHER_USER if switched else FIX_OWN_USER
    if "/" in argv0:
        why = _runnable(argv0)
        if why is None:
            return None
        missing = why == "no such file" or why.endswith("does not exist")
        return f"{who} cannot run {argv0}: {why}; {'check the path in the command' if missing else fix}"
    unreachable = []
    for folder in search:
        candidate = os.path.join(folder or ".", argv0)
        if os.path.isfile(candidate):
            why = _runnable(candidate)
            if why is None:
                return None
            return f"{who} cannot run {argv0} (found at {candidate}): {why}; {fix}"
        why = blocked(os.path.join(folder or ".", "x"))
        if why is not None and "does not exist" not in why:
            unreachable.append(f"{folder}: {why}")
    text = f"{who} cannot run {argv0}: not found on PATH {os.pathsep.join(search)}"
    if unreachable:
        text += f" (it cannot look in {'; '.join(unreachable)})"
    return f"{text}; {FIX_NOT_FOUND}"


def folder(exc: OSError, who: str, switched: bool) -> str:
    """What to say when `who` could not prepare or enter the job's folders (`exc`, from jobarea.enter or chdir)."""
    path = exc.filename
    text = f"{who} cannot enter the job's folder"
    if path is None:
        return f"{text}: {exc.strerror or exc}"
    why = None
    if isinstance(exc, (PermissionError, FileNotFoundError)):
        why = blocked(os.path.join(os.fsdecode(path), "x"))
    text = f"{text} {os.fsdecode(path)}: {exc.strerror or exc}"
    if why is not None and "does not exist" not in why:
        return f"{text} ({why}); {FIX_OTHER_USER if switched else FIX_OWN_USER}"
    return text
