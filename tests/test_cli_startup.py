"""The CLI starts light: `--help` and read commands import neither the bus nor the event models.

How long start-up takes is measured by bench/cli_startup.py (a benchmark, not a
test); this guards the cause: what each command imports.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

RUN_AND_LIST_MODULES = """
import json, runpy, sys
sys.argv = ["whaleflux", *sys.argv[1:]]
try:
    runpy.run_module("whaleflux", run_name="__main__")
except SystemExit:
    pass
print(json.dumps(sorted(sys.modules)), file=sys.stderr)
"""
BUS_AND_SERVICES = ("nats", "redis", "structlog", "fastapi", "uvicorn", "prometheus_client",
                    "whaleflux.shared.events", "whaleflux.shared.bus", "whaleflux.shared.runtime")


def _modules(tmp_path, *args: str) -> tuple[set[str], subprocess.CompletedProcess]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WHALEFLUX_", "NATS_", "REDIS_"))}
    env.update(WHALEFLUX_HOME=str(tmp_path / "home"), WHALEFLUX_SCHEDULER_URL=f"http://127.0.0.1:{closed}")
    done = subprocess.run([sys.executable, "-c", RUN_AND_LIST_MODULES, *args], env=env, capture_output=True,
                          text=True, timeout=120)
    modules = set(json.loads(done.stderr.strip().splitlines()[-1]))
    return {m.split(".")[0] if not m.startswith("whaleflux.") else m for m in modules}, done


def test_help_imports_no_bus_no_http_client_and_no_models(tmp_path):
    modules, done = _modules(tmp_path, "--help")
    assert "submit" in done.stdout and "trace" in done.stdout
    assert not modules & {*BUS_AND_SERVICES, "httpx", "pydantic", "yaml"}


@pytest.mark.parametrize("command", [["jobs"], ["jobs", "show", "abc"], ["alerts"], ["costs"], ["leases"]])
def test_read_commands_import_the_http_client_but_not_the_bus(tmp_path, command):
    modules, done = _modules(tmp_path, *command)
    assert "httpx" in modules
    assert not modules & set(BUS_AND_SERVICES), sorted(modules & set(BUS_AND_SERVICES))


def test_jobs_against_nothing_running_fails_at_once_naming_what_it_tried(tmp_path):
    modules, done = _modules(tmp_path, "jobs")
    assert "cannot reach the scheduler service at http://127.0.0.1:" in done.stdout
