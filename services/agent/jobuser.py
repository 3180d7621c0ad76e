"""Who a job runs as: its team's own unprivileged identity when the agent runs as root, root only when allowed.

- An agent running as root runs each job as a user it switches to (the user, its primary group, no
  supplementary groups, umask 077) just before the command starts: the user `WHALEFLUX_JOB_USERS` maps the
  job's `team/project` or `team` to (JSON, e.g. `{"vision": "vision-jobs", "vision/serving": "svc"}`; the more
  specific wins), else `WHALEFLUX_JOB_USER` when set (every other team's jobs then share that one user), else
  a uid of the team's own from the pool `WHALEFLUX_JOB_UIDS` (`UidPool`, default 61184-65519 as systemd's
  DynamicUser): one per team, kept in a file so that it stays the team's, never a uid /etc/passwd names.
  Jobs of different teams so never share a uid, and none can read another's environment (/proc/<pid>/environ),
  files or logs. Root needs `WHALEFLUX_ALLOW_ROOT_JOBS=true` wherever it is named. The job's HOME, USER and
  LOGNAME are that user's (a pool uid's HOME is the job's area) and its environment is scrubbed to an
  allow-list (`scrubbed`).
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
# Where a root agent's pool of per-team uids is, by default (systemd's range for dynamic users).
DEFAULT_UIDS = "61184-65519"
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
    """The user every job runs as when WHALEFLUX_JOB_USER names one (None: the agent's own, or per team from the
    pool), or ValueError naming the setting."""
    euid = os.geteuid() if euid is None else euid
    return None if job_user is None else _user(job_user, "WHALEFLUX_JOB_USER", allow_root, euid)


def parse_range(text: str, setting: str = "WHALEFLUX_JOB_UIDS") -> tuple[int, int]:
    """`first-last` as two uids, or ValueError naming the setting."""
    first, sep, last = text.partition("-")
    if not (sep and first.strip().isdigit() and last.strip().isdigit()):
        raise ValueError(f"{setting}: {text!r} is not a range of uids such as {DEFAULT_UIDS}")
    low, high = int(first), int(last)
    if not 1000 <= low <= high < 2**31 - 1:
        raise ValueError(f"{setting}: {text!r} must lie between 1000 and 2147483646, first <= last")
    return low, high


class UidPool:
    """A uid of its own for each team, from a range, recorded in `path` (JSON `{team: uid}`, 0600) so that a team
    keeps its uid across jobs, agents and restarts. Agents sharing the file take a lock on it to allocate."""

    def __init__(self, path: str, low: int, high: int) -> None:
        self.path, self.low, self.high = path, low, high
        self._known: dict[str, int] = {}

    def uid_for(self, team: str) -> str:
        """The team's uid (as text: what Spec.user holds), allocated on first use."""
        if team not in self._known:
            self._known = self._allocate(team)
        return str(self._known[team])

    def _allocate(self, team: str) -> dict[str, int]:
        import fcntl
        import json

        os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "r+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            text = fh.read()
            known: dict[str, int] = json.loads(text) if text.strip() else {}
            if team not in known:
                known[team] = self._free(set(known.values()))
                fh.seek(0)
                fh.truncate()
                fh.write(json.dumps(known, indent=1, sort_keys=True))
                fh.flush()
                os.fsync(fh.fileno())
        return known

    def _free(self, taken: set[int]) -> int:
        for uid in range(self.low, self.high + 1):
            if uid in taken:
                continue
            try:
                pwd.getpwuid(uid)  # a uid the machine gave someone is never a team's
            except KeyError:
                return uid
        raise RuntimeError(f"WHALEFLUX_JOB_UIDS: all {self.high - self.low + 1} uids are taken")


class JobUsers:
    """The user each job runs as: by `team/project`, by `team`, else the default, else the team's uid from the pool
    (None: the agent's own)."""

    def __init__(self, default: str | None = None, by_team: Mapping[str, str | None] | None = None,
                 pool: UidPool | None = None) -> None:
        self.default = default
        self.by_team = dict(by_team or {})
        self.pool = pool

    @classmethod
    def resolve(cls, job_user: str | None, mapping: Mapping[str, str], allow_root: bool,
                euid: int | None = None, pool_file: str | None = None, uids: str = DEFAULT_UIDS) -> JobUsers:
        """The users of the settings, checked; a root agent with a pool file and no WHALEFLUX_JOB_USER gives each
        other team a uid of its own."""
        euid = os.geteuid() if euid is None else euid
        low, high = parse_range(uids)
        pool = UidPool(pool_file, low, high) if euid == 0 and job_user is None and pool_file else None
        return cls(resolve(job_user, allow_root, euid),
                   {key: _user(name, f"WHALEFLUX_JOB_USERS[{key!r}]", allow_root, euid)
                    for key, name in mapping.items()}, pool)

    def for_job(self, team: str, project: str) -> str | None:
        for key in (f"{team}/{project}", team):
            if key in self.by_team:
                return self.by_team[key]
        if self.default is None and self.pool is not None:
            return self.pool.uid_for(team)
        return self.default

    @property
    def switches(self) -> bool:
        """Whether any job may run as a user other than the agent's."""
        return self.pool is not None or self.default is not None or any(self.by_team.values())


def scrubbed(env: Mapping[str, str]) -> dict[str, str]:
    """The part of the agent's environment a job running as another user keeps."""
    return {k: v for k, v in env.items() if k in KEPT_ENV or k.startswith(KEPT_PREFIXES)}


def _ids(user: str) -> tuple[int, int, str | None]:
    """(uid, gid, home) of a user name, or of a pool uid that /etc/passwd does not name (its own gid, no home)."""
    if user.isdigit():
        try:
            entry = pwd.getpwuid(int(user))
        except KeyError:
            return int(user), int(user), None
    else:
        entry = pwd.getpwnam(user)
    return entry.pw_uid, entry.pw_gid, entry.pw_dir


def popen_args(user: str | None) -> tuple[int | None, int | None, list[int] | None, int]:
    """subprocess.Popen's (user, group, extra_groups, umask) that start the command as `user`; Popen's own
    defaults (None, None, None, -1) for None."""
    if user is None:
        return None, None, None, -1
    uid, gid, _ = _ids(user)
    return uid, gid, [], 0o077


def environment(user: str | None, area: str | None = None) -> dict[str, str]:
    """The job's HOME, USER and LOGNAME when it runs as `user` (a pool uid's HOME: the job's area)."""
    if user is None:
        return {}
    uid, _, home = _ids(user)
    name = pwd.getpwuid(uid).pw_name if home is not None else f"whaleflux-{uid}"
    return {"HOME": home or area or "/", "USER": name, "LOGNAME": name}


def owner(user: str | None) -> tuple[int, int]:
    """(uid, gid) that a folder of the job's (its area) belongs to: the job's user, or the agent's own."""
    if user is None:
        return os.geteuid(), os.getegid()
    uid, gid, _ = _ids(user)
    return uid, gid
