"""Who a job runs as: an unprivileged user when the agent runs as root, root only when explicitly allowed.

- An agent running as root runs each job as a user it switches to (the user, its primary group, no
  supplementary groups, umask 077) just before the command starts: the user `WHALEFLUX_JOB_USERS` maps the
  job's `team/project` or `team` to (JSON, e.g. `{"vision": "vision-jobs", "vision/serving": "svc"}`; the more
  specific wins), else `WHALEFLUX_JOB_USER`, else `nobody` (DEFAULT_USER). Root needs
  `WHALEFLUX_ALLOW_ROOT_JOBS=true` wherever it is named. The job's HOME, USER and LOGNAME are that user's and
  its environment is scrubbed to an allow-list (`scrubbed`).
- An agent that does not run as root cannot switch users: its jobs run as its own (unprivileged) user, and
  naming another is an error at start.
Every user named is checked at start (`JobUsers.resolve`): an unknown one stops the agent with the setting named.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Mapping  # loaded with the interpreter already

# No `typing`, `dataclasses` nor `pathlib` here: the supervisor imports this module at each job's start (typing
# alone costs it ~25 ms).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path

DEFAULT_USER = "nobody"
# What a job running as another user keeps of the agent's environment (its own `env` is added on top): the
# search path, the locale and time zone, and what finds the GPU libraries. Nothing else: the agent's
# credentials, proxies, agent sockets stay with the agent.
KEPT_ENV = ("PATH", "LANG", "LANGUAGE", "TZ", "TERM", "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH")
KEPT_PREFIXES = ("LC_", "NVIDIA_")


def _user(name: str, setting: str, allow_root: bool, euid: int) -> str | None:
    """The user `name` (a name or uid) jobs switch to (None: the agent's own), or ValueError naming `setting`."""
    try:
        entry = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
    except (KeyError, OverflowError):
        raise ValueError(f"{setting}: no user {name!r} on this machine") from None
    if entry.pw_uid == 0 and not allow_root:
        raise ValueError(f"{setting}: jobs may run as root only with WHALEFLUX_ALLOW_ROOT_JOBS=true")
    if euid != 0 and entry.pw_uid != euid:
        raise ValueError(f"{setting}: only an agent running as root can run jobs as {entry.pw_name!r}")
    return entry.pw_name if euid == 0 and entry.pw_uid != euid else None


def resolve(job_user: str | None, allow_root: bool, euid: int | None = None) -> str | None:
    """The user jobs run as by default (None: the agent's own), or ValueError naming WHALEFLUX_JOB_USER. A root
    agent with none named runs them as DEFAULT_USER."""
    euid = os.geteuid() if euid is None else euid
    if job_user is None:
        return _user(DEFAULT_USER, "WHALEFLUX_JOB_USER (default)", allow_root, euid) if euid == 0 else None
    return _user(job_user, "WHALEFLUX_JOB_USER", allow_root, euid)


class JobUsers:
    """The user each job runs as: by `team/project`, by `team`, else the default (None: the agent's own)."""

    def __init__(self, default: str | None = None, by_team: Mapping[str, str | None] | None = None) -> None:
        self.default = default
        self.by_team = dict(by_team or {})

    @classmethod
    def resolve(cls, job_user: str | None, mapping: Mapping[str, str], allow_root: bool,
                euid: int | None = None) -> JobUsers:
        euid = os.geteuid() if euid is None else euid
        return cls(resolve(job_user, allow_root, euid),
                   {key: _user(name, f"WHALEFLUX_JOB_USERS[{key!r}]", allow_root, euid)
                    for key, name in mapping.items()})

    def for_job(self, team: str, project: str) -> str | None:
        for key in (f"{team}/{project}", team):
            if key in self.by_team:
                return self.by_team[key]
        return self.default


def scrubbed(env: Mapping[str, str]) -> dict[str, str]:
    """The part of the agent's environment a job running as another user keeps."""
    return {k: v for k, v in env.items() if k in KEPT_ENV or k.startswith(KEPT_PREFIXES)}


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
