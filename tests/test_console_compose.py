"""docker-compose.yml runs the console next to the services it reads (PyYAML only, no Docker)."""

from __future__ import annotations

from pathlib import Path

import yaml

COMPOSE = Path(__file__).resolve().parents[1] / "docker-compose.yml"


def test_compose_runs_the_console_against_every_service():
    console = yaml.safe_load(COMPOSE.read_text())["services"]["console"]
    assert console["command"] == ["python", "-m", "whaleflux.console"] and "build" in console
    env = console["environment"]
    for name in ("telemetry", "scheduler", "alerting", "billing", "inventory"):
        assert env[f"WHALEFLUX_{name.upper()}_URL"] == f"http://{name}:8000"
    assert env["WHALEFLUX_ENVIRONMENT"] == "production"
    # Its own admin token and a viewer's for its background reads, never the people's admin token.
    assert env["WHALEFLUX_ADMIN_TOKEN_FILE"] == "/run/secrets/console_admin"
    assert env["WHALEFLUX_API_TOKEN_FILE"] == "/run/secrets/token_console" and "admin_token" not in console["secrets"]
    assert "8706:8000" in console["ports"] and "healthcheck" in console
