"""The suite runs as root in CI, and its jobs write into the test's folders, which only root may enter: so its
agents run jobs as root, explicitly (a root agent's default is `nobody`: tests/test_agent_job_user.py proves it)."""

from __future__ import annotations

import os

ROOT_JOBS = {"WHALEFLUX_JOB_USER": "root", "WHALEFLUX_ALLOW_ROOT_JOBS": "true"} if os.geteuid() == 0 else {}


def reachable_folder(tmp_path, name: str):
    """A new folder under `tmp_path` that jobs running as other users can pass through: pytest's own folders let
    only root in, so it lies in a 0711 folder of the system's temporary folder, kept for this test only."""
    import tempfile
    from pathlib import Path

    base = Path(tempfile.mkdtemp(prefix=f"whaleflux-{tmp_path.name}-"))
    base.chmod(0o711)
    (tmp_path / f"{name}.where").write_text(str(base))  # for whoever reads the test's folder afterwards
    return base / name
