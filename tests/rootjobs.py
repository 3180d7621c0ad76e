"""The suite runs as root in CI, and its jobs write into the test's folders, which only root may enter: so its
agents run jobs as root, explicitly (a root agent's default is `nobody`: tests/test_agent_job_user.py proves it)."""

from __future__ import annotations

import os

ROOT_JOBS = {"WHALEFLUX_JOB_USER": "root", "WHALEFLUX_ALLOW_ROOT_JOBS": "true"} if os.geteuid() == 0 else {}
