"""Behaviour-level checks of docker-compose.yml; needs only PyYAML (no Docker)."""

from __future__ import annotations

import re
import shlex
import subprocess
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
        for key in ("NATS_URL", "REDIS_URL", "WHALEFLUX_TOKENS_FILE"):
            assert env.get(key), f"{name}: {key} not set"
        assert env.get("WHALEFLUX_ENVIRONMENT") == "production", name
        assert "build" in svc, f"{name} must be built from the Dockerfile"


def _secret_files(compose: dict) -> dict[str, str]:
    """Top-level secret name -> its file (relative to the repository root)."""
    return {name: spec["file"] for name, spec in (compose.get("secrets") or {}).items()}


def test_secrets_have_no_literal_values_and_none_is_on_a_command_line(compose, services):
    checked = 0
    for name, svc in services.items():
        mounted = set(svc.get("secrets") or [])
        for key, value in _environment(svc).items():
            if not SECRET_NAME.search(key):
                continue
            checked += 1
            if key.endswith("_FILE"):
                # A file the container mounts (docker secrets land in /run/secrets/<name>), or none at all.
                assert value == "" or (value.startswith("/run/secrets/") and value.split("/")[-1] in mounted), \
                    f"{name}: {key}={value!r} is not one of its secrets {sorted(mounted)}"
            else:
                assert SECRET_REF.match(value), f"{name}: {key}={value!r} is not a required ${{VAR}} reference"
        cmd = _command(svc)
        assert not {"--pass", "--password", "--requirepass", "--auth", "--user", "-a"} & set(cmd), f"{name}: {cmd}"
        assert mounted <= set(_secret_files(compose)), f"{name}: undeclared secrets"
    assert checked > 0


def test_each_whaleflux_container_has_its_own_nats_identity(compose, services):
    files = _secret_files(compose)
    users = {}
    for name, svc in _whaleflux_containers(services).items():
        env = _environment(svc)
        user, path = env["WHALEFLUX_NATS_USER"], env["WHALEFLUX_NATS_PASSWORD_FILE"]
        assert "WHALEFLUX_NATS_PASSWORD" not in env, name
        assert files[path.removeprefix("/run/secrets/")] == f"./deploy/secrets/{user}.nats", name
        users[name] = user
    assert len(set(users.values())) == len(users)  # nobody shares one
    assert {users[name] for name in SERVICES} == set(SERVICES)


def test_issued_secrets_match_the_compose_file_and_are_private(compose, services, tmp_path):
    """deploy/issue_secrets.py: a NATS user for every container's identity, each only its permissions; mode 0600;
    passwords kept when issued again."""
    import importlib.util
    import json
    import stat

    spec = importlib.util.spec_from_file_location("issue_secrets", ROOT / "deploy" / "issue_secrets.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "secrets"
    users = module.issue(out, compose, ROOT)
    wanted = {_environment(svc)["WHALEFLUX_NATS_USER"] for svc in _whaleflux_containers(services).values()}
    assert wanted <= set(users)
    for path in out.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    for name in _secret_files(compose).values():
        assert (ROOT / name).parent == ROOT / "deploy" / "secrets" and (out / Path(name).name).exists(), name
    conf = (out / "nats.conf").read_text()
    granted = {json.loads(line.strip().rstrip(","))["user"]: json.loads(line.strip().rstrip(","))["permissions"]
               for line in conf.splitlines() if line.strip().startswith('{"user"')}
    assert set(granted) == set(users)
    assert "gpu.telemetry.onprem.a100-01" in granted["agent-a"]["publish"]["allow"]
    assert "gpu.telemetry.onprem.h100-01" not in granted["agent-a"]["publish"]["allow"]
    assert "jetstream" in conf and "http_port: 8222" in conf
    from whaleflux.servers import nats_server_binary

    checked = subprocess.run([nats_server_binary(), "-t", "-c", str(out / "nats.conf")], capture_output=True,
                             text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr  # nats-server accepts the config
    redis = (out / "redis.password").read_text()
    assert f'requirepass "{redis}"' in (out / "redis.conf").read_text()
    before = {p.name: p.read_text() for p in out.iterdir()}
    module.issue(out, compose, ROOT)
    assert {p.name: p.read_text() for p in out.iterdir()} == before
    assert redis not in COMPOSE.read_text()


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
