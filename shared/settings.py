"""Settings common to every WhaleFlux process; each service subclasses them.

Values come from the environment (`WHALEFLUX_*`, plus the conventional
`NATS_URL` / `REDIS_URL`). A secret can come from a file instead:
`WHALEFLUX_<NAME>_FILE` (e.g. WHALEFLUX_NATS_PASSWORD_FILE=/run/secrets/nats), so
it is never on a command line nor in the process's environment. Outside
development a missing or weak secret stops the process at start-up instead of
running with a default.
"""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path
from typing import Any, ClassVar, Literal, get_args

from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

MIN_SECRET_LEN = 16
_USERINFO = re.compile(r"^([a-z][a-z0-9+.-]*://)[^@/]*@")


class CommonSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="WHALEFLUX_", extra="ignore")
    # Secrets a process of this kind must be given outside development.
    required_secrets: ClassVar[tuple[str, ...]] = ("admin_token", "nats_password", "redis_password")
    # A process that only checks tokens may do without an admin token of its own when a tokens file or OIDC
    # names its callers; one that signs with it (the console's sessions) may not.
    admin_token_optional_with_tokens: ClassVar[bool] = True

    environment: Literal["development", "production"] = "development"
    nats_url: str = Field("nats://127.0.0.1:4222", validation_alias=AliasChoices("NATS_URL", "WHALEFLUX_NATS_URL"))
    nats_user: str | None = None
    # Copies JetStream keeps of every stream and bucket: 1 on one server, 3 in a three-server cluster
    # (NATS_URL then lists the servers, comma-separated).
    nats_replicas: int = Field(1, ge=1, le=5)
    nats_password: SecretStr | None = None
    redis_url: str = Field("redis://127.0.0.1:6379/0",
                           validation_alias=AliasChoices("REDIS_URL", "WHALEFLUX_REDIS_URL"))
    redis_password: SecretStr | None = None
    # Redis behind Sentinel: `host:port,host:port,...` of the sentinels; empty: the one server of REDIS_URL.
    redis_sentinels: str = ""
    redis_master: str = "whaleflux"  # the master's name in the sentinels' config
    # Behind Sentinel: replicas that must confirm a service's writes before it acknowledges or publishes.
    redis_min_replicas: int = Field(1, ge=0)
    admin_token: SecretStr | None = None
    # People and components over HTTP (docs/security.md): tokens with roles, OIDC, the audit log, and the token
    # this process sends when it calls another service.
    tokens_file: Path | None = Field(None, description="hashed API tokens with roles (JSON, mode 0600)")
    oidc_issuer: str | None = None
    oidc_audience: str | None = None
    oidc_jwks_url: str | None = None
    oidc_name_claim: str = "preferred_username"
    oidc_role_claim: str = "whaleflux_role"
    oidc_teams_claim: str = "whaleflux_teams"
    audit_log: Path | None = Field(None, description="JSONL file every state-changing request is appended to")
    api_token: SecretStr | None = None
    http_host: str = "127.0.0.1"
    http_port: int = Field(8700, ge=0, le=65535)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    instance: str = Field(default_factory=lambda: secrets.token_hex(3))
    # This service runs as several replicas that share its work: partitions by node, leased in Redis
    # (shared/partitions.py). A replica that dies hands its partitions over within about two leases.
    scale_out: bool = False
    partition_lease_s: float = Field(5.0, ge=1.0, le=60.0)

    @model_validator(mode="before")
    @classmethod
    def _secret_files(cls, data: Any) -> Any:
        """A secret not set directly is read from the file WHALEFLUX_<NAME>_FILE names, if it is set."""
        if not isinstance(data, dict):
            return data
        for name, info in cls.model_fields.items():
            if SecretStr not in (info.annotation, *get_args(info.annotation)) or data.get(name) is not None:
                continue
            variable = f"WHALEFLUX_{name.upper()}_FILE"
            if path := os.environ.get(variable):
                try:
                    data[name] = Path(path).read_text().strip()
                except OSError as exc:
                    raise ValueError(f"{variable}: cannot read {path} ({exc.strerror})") from None
        return data

    @field_validator("redis_sentinels")
    @classmethod
    def _sentinels(cls, value: str) -> str:
        for address in filter(None, (part.strip() for part in value.split(","))):
            host, _, port = address.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) <= 65535:
                raise ValueError(f"WHALEFLUX_REDIS_SENTINELS: {address!r} is not host:port")
        return value

    def sentinel_addresses(self) -> list[tuple[str, int]]:
        """The sentinels of WHALEFLUX_REDIS_SENTINELS as (host, port)."""
        out = []
        for address in filter(None, (part.strip() for part in self.redis_sentinels.split(","))):
            host, _, port = address.rpartition(":")
            out.append((host, int(port)))
        return out

    @field_validator("http_port")
    @classmethod
    def _port(cls, value: int) -> int:
        # Subclasses override the default port; the bounds must hold for all.
        if not 0 <= value <= 65535:
            raise ValueError("WHALEFLUX_HTTP_PORT must be between 0 and 65535")
        return value

    @model_validator(mode="after")
    def _secrets_outside_development(self) -> CommonSettings:
        if self.oidc_issuer and not (self.oidc_audience and self.oidc_jwks_url):
            raise ValueError("WHALEFLUX_OIDC_ISSUER needs WHALEFLUX_OIDC_AUDIENCE and WHALEFLUX_OIDC_JWKS_URL")
        if self.environment == "production":
            for name in self.required_secrets:
                if (name == "admin_token" and self.admin_token_optional_with_tokens and self.admin_token is None
                        and (self.tokens_file or self.oidc_issuer)):
                    continue  # people and components have tokens of their own

                value = getattr(self, name)
                if value is None or len(value.get_secret_value()) < MIN_SECRET_LEN:
                    raise ValueError(
                        f"WHALEFLUX_{name.upper()} must be set to at least {MIN_SECRET_LEN} characters "
                        "when WHALEFLUX_ENVIRONMENT=production"
                    )
        elif self.admin_token is None:
            # Development without a token: admin endpoints stay locked behind a
            # random token nobody knows, rather than open.
            self.admin_token = SecretStr(secrets.token_urlsafe(32))
        return self

    def redacted(self) -> dict[str, Any]:
        """Settings as a dict safe to show: secrets are masked."""
        out: dict[str, Any] = {}
        for key, value in self.model_dump().items():
            if isinstance(value, SecretStr):
                value = "********"
            elif isinstance(value, str) and "://" in value and "@" in value:
                value = _USERINFO.sub(r"\1********@", value)  # a password inside a URL
            out[key] = value
        return out

    def client_headers(self) -> dict[str, str]:
        """Headers for this process's calls to another WhaleFlux service: its own token (`WHALEFLUX_API_TOKEN`),
        which reads need in production. Never for calls outside WhaleFlux (webhooks, receivers)."""
        token = self.secret("api_token")
        return {"Authorization": f"Bearer {token}"} if token else {}

    def secret(self, name: str) -> str | None:
        value = getattr(self, name)
        return value.get_secret_value() if value is not None else None
