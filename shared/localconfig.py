"""The local config file `whaleflux up` writes and the CLI reads (mode 0600).

It lives in WHALEFLUX_HOME (default ~/.whaleflux) and holds the generated
NATS/Redis passwords, the admin token and where each service listens.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

from pydantic import BaseModel, Field

SERVICES = ("telemetry", "scheduler", "alerting", "billing", "inventory")


def home() -> Path:
    return Path(os.environ.get("WHALEFLUX_HOME", Path.home() / ".whaleflux")).expanduser()


def config_path() -> Path:
    return home() / "config.json"


class LocalConfig(BaseModel):
    nats_url: str | None = None
    redis_url: str | None = None
    nats_user: str = "whaleflux"
    nats_password: str = Field(default_factory=lambda: secrets.token_urlsafe(24))
    redis_password: str = Field(default_factory=lambda: secrets.token_urlsafe(24))
    admin_token: str = Field(default_factory=lambda: secrets.token_urlsafe(32))
    services: dict[str, str] = Field(default_factory=dict)

    def save(self, path: Path | None = None) -> Path:
        path = path or config_path()
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(self.model_dump_json(indent=2))
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
        return path


def load(path: Path | None = None) -> LocalConfig | None:
    path = path or config_path()
    if not path.exists():
        return None
    return LocalConfig.model_validate(json.loads(path.read_text()))


def load_or_create(path: Path | None = None) -> LocalConfig:
    """Secrets are generated on first run and kept for later runs."""
    cfg = load(path)
    if cfg is None:
        cfg = LocalConfig()
        cfg.save(path)
    return cfg
