"""Who a job runs as: an unprivileged user when the agent runs as root, root only when explicitly allowed.

`WHALEFLUX_JOB_USER` (a user name or uid) names the user; the agent checks it at start (`resolve`), the
supervisor switches to it (user, its primary group, no supplementary groups) just before it starts the
command, and the job's HOME, USER and LOGNAME are that user's. An agent that does not run as root cannot
switch users: its jobs run as its own (unprivileged) user, and naming another is an error.
"""

from __future__ import annotations

import os
import pwd
from pathlib import Path

# No `typing` here: the supervisor imports this module at each job's start (typing alone costs it ~25 ms).


def resolve(job_user: str | None, allow_root: bool, euid: int | None = None) -> str | None:
    """The user jobs run as (None: the agent's own), or ValueError naming WHALEFLUX_JOB_USER."""
    euid = os.geteuid() if euid is None else euid
    if job_user is None:
        return None
    try:
        entry = pwd.getpwuid(int(job_user)) if job_user.isdigit() else pwd.getpwnam(job_user)
    except (KeyError, OverflowError):
        raise ValueError(f"WHALEFLUX_JOB_USER: no user {job_user!r} on this machine") from None
    if entry.pw_uid == 0 and not allow_root:
        raise ValueError("WHALEFLUX_JOB_USER: jobs may run as root only with WHALEFLUX_ALLOW_ROOT_JOBS=true")
    if euid != 0 and entry.pw_uid != euid:
        raise ValueError(f"WHALEFLUX_JOB_USER: only an agent running as root can run jobs as {entry.pw_name!r}")
    return entry.pw_name if euid == 0 and entry.pw_uid != euid else None


def popen_args(user: str | None) -> tuple[int | None, int | None, list[int] | None, int]:
    """subprocess.Popen's (user, group, extra_groups, umask) that start the command as `user`; Popen's own
    defaults (None, None, None, -1) for None."""
    if user is None:
        return None, None, None, -1
    entry = pwd.getpwnam(user)
    return entry.pw_uid, entry.pw_gid, [], 0o077


def environment(user: str | None) -> dict[str, str]:
    """The job's HOME, USER and LOGNAME when it runs as `user`."""
    if user is None:
        return {}
    entry = pwd.getpwnam(user)
    return {"HOME": entry.pw_dir, "USER": entry.pw_name, "LOGNAME": entry.pw_name}


def give(folder: Path, user: str | None) -> None:
    """Make a folder the job writes (its checkpoints) the job user's."""
    if user is not None:
        entry = pwd.getpwnam(user)
        os.chown(folder, entry.pw_uid, entry.pw_gid)
