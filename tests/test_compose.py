"""Behaviour-level checks of docker-compose.yml; needs only PyYAML (no Docker)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
FLEET = ROOT / "shared" / "data" / "fleets" / "small-demo.yaml"

SERVICES = ("telemetry", "scheduler", "alerting", "billing", "inventory")
SECRET_NAME = re.compile(r"PASSWORD|TOKEN|SECRET|AUTH|API_KEY|PASS$", re.IGNORECASE)
# `${VAR}` or `${VAR:?message}` / `${VAR?message}`: a reference with no default.
SECRET_REF = re.compile(r"^\$\{[A-Za-z_][A-Za-z0-9_]*(:?\?[^}]*)?\}$")


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def services(compose) -> dict:
    return compose["services"]


def _command(service: dict) -> list[str]:
    cmd = service.get("command", [])
    return shlex.split(cmd) if isinstance(cmd, str) else [str(part) for part in cmd]


def _environment(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, None) for item in env)
    return {key: ("" if value is None else str(value)) for key, value in env.items()}


def _whaleflux_containers(services: dict) -> dict[str, dict]:
    return {name: svc for name, svc in services.items() if _command(svc)[:1] == ["whaleflux"]}


def _agents(services: dict) -> dict[str, dict]:
    return {name: svc for name, svc in services.items() if _command(svc)[:2] == ["whaleflux", "agent"]}


def test_expected_services_exist(services):
    for name in ("nats", "redis", *SERVICES):
        assert name in services, f"missing service {name}"
    assert len(_agents(services)) >= 2


def test_nats_enables_jetstream(services):
    assert "-js" in _command(services["nats"]) or "--jetstream" in _command(services["nats"])


def test_each_service_runs_its_own_name(services):
    for name in SERVICES:
        assert _command(services[name]) == ["whaleflux", "service", name]


def test_whaleflux_containers_get_core_environment(services):
    containers = _whaleflux_containers(services)
    assert set(SERVICES) <= set(containers)
    for name, svc in containers.items():
        env = _environment(svc)
        for key in ("NATS_URL", "REDIS_URL", "WHALEFLUX_ADMIN_TOKEN"):
            assert env.get(key), f"{name}: {key} not set"
        assert env.get("WHALEFLUX_ENVIRONMENT") == "production", name
        assert "build" in svc, f"{name} must be built from the Dockerfile"


def test_secrets_have_no_literal_values(services):
    checked = 0
    for name, svc in services.items():
        for key, value in _environment(svc).items():
            if SECRET_NAME.search(key):
                checked += 1
                assert SECRET_REF.match(value), f"{name}: {key}={value!r} is not a required ${{VAR}} reference"
        # Secrets passed as flags (nats --pass, redis --requirepass) too.
        cmd = _command(svc)
        for flag, value in zip(cmd, cmd[1:], strict=False):
            if flag in ("--pass", "--password", "--requirepass", "--auth"):
                checked += 1
                assert SECRET_REF.match(value), f"{name}: {flag} {value!r} is not a required ${{VAR}} reference"
    assert checked > 0


def test_agents_cover_every_fleet_node(services):
    fleet = yaml.safe_load(FLEET.read_text())
    expected = {
        f"{group['name']}-{index:02d}" for group in fleet["groups"] for index in range(1, int(group["nodes"]) + 1)
    }
    covered: set[str] = set()
    for name, svc in _agents(services).items():
        cmd = _command(svc)
        assert "--simulate" in cmd, name
        fleet_path = cmd[cmd.index("--simulate") + 1]
        assert fleet_path == "/app/shared/data/fleets/small-demo.yaml", name
        covered |= {value for flag, value in zip(cmd, cmd[1:], strict=False) if flag == "--node"}
    assert expected <= covered, f"nodes without an agent: {sorted(expected - covered)}"
