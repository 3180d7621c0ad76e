"""The paths a job names are its own: inside its area on the node, or inside a root an admin allows its team.

A job's `workdir` and `checkpoint_dir` are relative to its area (`<job areas>/<job id>` on the node, see
docs/security.md) unless absolute; an absolute one must lie inside one of its team's allowed roots
(`WHALEFLUX_TEAM_ROOTS`, JSON such as `{"vision": ["/data/vision"], "*": ["/scratch"]}`, `*` for every team).
No `..` anywhere, so that a path means what it says before any symlink is followed. The scheduler refuses
other paths at submission (the field named); the agent checks again, then creates and enters them only as
the job's user and refuses one whose real location (symlinks followed) lies outside the same places.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence

# The fields of a job that name a folder on the node.
PATH_FIELDS = ("workdir", "checkpoint_dir")
EVERY_TEAM = "*"


def team_roots(team: str, roots: Mapping[str, Sequence[str]]) -> list[str]:
    """The absolute folders `team`'s jobs may name besides their own area."""
    return [*roots.get(team, ()), *roots.get(EVERY_TEAM, ())]


def within(path: str, root: str) -> bool:
    """Whether `path` is `root` or lies inside it (both absolute; compared as written, after normalizing)."""
    path, root = posixpath.normpath(path), posixpath.normpath(root)
    return path == root or path.startswith(root.rstrip("/") + "/")


def refusal(value: str, team: str, roots: Mapping[str, Sequence[str]]) -> str | None:
    """Why a folder a job of `team` names is not its own to use; None when it is."""
    if not value.strip():
        return "must not be empty"
    if ".." in value.split("/"):
        return "must not contain '..'"
    if not value.startswith("/"):
        return None
    allowed = team_roots(team, roots)
    if any(within(value, root) for root in allowed):
        return None
    if allowed:
        return f"must lie inside the job's area or one of team {team!r}'s roots: {', '.join(allowed)}"
    return (f"absolute paths are not allowed for team {team!r}: use a path relative to the job's area "
            "(an admin may allow roots per team with WHALEFLUX_TEAM_ROOTS)")


def refusals(fields: Mapping[str, str | None], team: str, roots: Mapping[str, Sequence[str]]) -> dict[str, str]:
    """Each path field of a job that is not its own, with the reason."""
    out = {}
    for name in PATH_FIELDS:
        value = fields.get(name)
        if value is not None and (reason := refusal(value, team, roots)) is not None:
            out[name] = reason
    return out


def check_roots(roots: Mapping[str, Sequence[str]], setting: str = "WHALEFLUX_TEAM_ROOTS") -> None:
    """ValueError naming the setting when an allowed root is not an absolute, plain folder path."""
    for team, folders in roots.items():
        for folder in folders:
            if not folder.startswith("/") or ".." in folder.split("/") or posixpath.normpath(folder) == "/":
                raise ValueError(f"{setting}[{team!r}]: {folder!r} must be an absolute folder other than /"
                                 " without '..'")


def resolve(value: str | None, area: str) -> str:
    """Where a path field leads: the area itself when unset, else the path relative to the area (or absolute)."""
    return area if value is None else posixpath.normpath(posixpath.join(area, value))
