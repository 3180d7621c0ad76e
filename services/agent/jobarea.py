"""A job's own area on its node: `<job areas>/<job id>`, the job user's alone (0700), its default working folder,
HOME (for a pool uid) and the root of every relative path it names (shared/job_paths.py).

The agent creates the area itself, as root if it is root: the folder of areas is the agent's (0711: others may
pass through, not list it or write there) and a job id is a single plain name, so no job can put a symlink on
that path. Everything a job names inside it, or inside a root its team is allowed, is created and entered only
in the job's own process after the switch to its user (`enter`, run by the supervisor), never as root, and
refused where its real location (symlinks followed) leaves those places.

Standard library only: the supervisor imports it at each job's start.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence  # loaded with the interpreter already


def make(root: str, job_id: str, uid: int, gid: int) -> str:
    """The job's area under `root`, created if new, owned by (uid, gid) and 0700; OSError if it cannot be."""
    if not job_id or "/" in job_id or job_id.startswith("."):
        raise OSError(f"job id {job_id!r} cannot name a folder")
    if not os.path.isdir(root):
        os.makedirs(root, mode=0o711, exist_ok=True)
        os.chmod(root, 0o711)  # noqa: S103 - others pass through to their own area, no more (no listing)
    area = os.path.join(root, job_id)
    try:
        os.mkdir(area, 0o700)
    except FileExistsError:
        pass
    found = os.lstat(area)
    if not stat.S_ISDIR(found.st_mode):
        raise OSError(f"{area} is not a folder")
    if (found.st_uid, found.st_gid) != (uid, gid):
        os.lchown(area, uid, gid)
    if stat.S_IMODE(found.st_mode) != 0o700:
        os.chmod(area, 0o700)
    return area


def unreachable(folder: str) -> str | None:
    """The first folder on the way to `folder` that users other than its owner cannot pass through; None if none."""
    path = os.path.abspath(folder)
    while True:
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            mode = stat.S_IXOTH  # created later by the agent (0711)
        if not mode & stat.S_IXOTH:
            return path
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent


def _inside(path: str, places: Sequence[str]) -> bool:
    real = os.path.realpath(path)
    for place in places:
        place = os.path.realpath(place)
        if real == place or real.startswith(place.rstrip("/") + "/"):
            return True
    return False


def enter(cwd: str, make_dirs: Sequence[str], places: Sequence[str]) -> None:
    """In the job's process, as its user: create `make_dirs`, enter `cwd`; OSError naming a path whose real
    location lies outside `places` (the area and the team's allowed roots)."""
    for folder in (*make_dirs, cwd):
        _check(folder, places)
    for folder in make_dirs:
        os.makedirs(folder, exist_ok=True)
        _check(folder, places)
    os.chdir(cwd)


def _check(folder: str, places: Sequence[str]) -> None:
    if not _inside(folder, places):
        raise OSError(f"{folder} leads outside the job's area and its team's roots (to {os.path.realpath(folder)})")
