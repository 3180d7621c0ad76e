"""Issue every credential of the compose deployment into deploy/secrets/ (mode 0600), from shared/permissions.py.

    python deploy/issue_secrets.py            # in an environment with WhaleFlux installed (e.g. .venv/bin/python)
    sudo .venv/bin/python deploy/issue_secrets.py   # on Linux: each file then belongs to the container user reading it

Writes nats.conf (JetStream, monitoring, one NATS user per component with its permissions), one `<user>.nats`
password file per NATS user, redis.conf and redis.password; and the HTTP credentials: tokens.json (the hashes
every WhaleFlux container reads), admin.token (the people's admin token: the CLI's), a `<name>.token` for each
component that calls a service (a viewer accepted only by those it calls: the console's for its background reads)
and console.admin (the console's own admin token, accepted by the console only). The agents'
identities come from the agent containers of docker-compose.yml (their `--node` flags), so they cannot drift.
Passwords and tokens already issued are kept: running it again after adding an agent changes nothing else.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shlex
import sys
from pathlib import Path

import yaml

from whaleflux.local import SERVICE_LINKS
from whaleflux.shared import access
from whaleflux.shared.catalog import load_fleet
from whaleflux.shared.permissions import (
    Identity,
    agent_identity,
    console_identity,
    nats_authorization,
    operator_identity,
    service_identity,
    submitter_identity,
)

ROOT = Path(__file__).resolve().parents[1]
SERVICES = ("telemetry", "scheduler", "alerting", "billing", "inventory")
# Who reads each file inside its container (uids of the images): nats runs as root, redis-server as redis
# (999), WhaleFlux as whaleflux (10001, the Dockerfile's).
NATS_UID, REDIS_UID, WHALEFLUX_UID = 0, 999, 10001


def agent_identities(compose: dict, fleet_root: Path) -> list[Identity]:
    """One identity per agent container of the compose file, for the nodes its `--node` flags name."""
    out = []
    for name, svc in compose["services"].items():
        cmd = svc.get("command") or []
        cmd = shlex.split(cmd) if isinstance(cmd, str) else [str(part) for part in cmd]
        if cmd[:2] != ["whaleflux", "agent"]:
            continue
        fleet_path = cmd[cmd.index("--simulate") + 1].removeprefix("/app/")
        clusters = {node.name: node.cluster for node in load_fleet(fleet_root / fleet_path).nodes()}
        nodes = [value for flag, value in zip(cmd, cmd[1:], strict=False) if flag == "--node"]
        out.append(agent_identity([(clusters[node], node) for node in nodes], user=name))
    return out


def identities(compose: dict, fleet_root: Path) -> list[Identity]:
    return [*(service_identity(name) for name in SERVICES), console_identity(), operator_identity(),
            submitter_identity(), *agent_identities(compose, fleet_root)]


def _password(path: Path) -> str:
    return path.read_text().strip() if path.exists() else secrets.token_urlsafe(32)


def _write(path: Path, text: str, uid: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(path, 0o600)
    if os.geteuid() == 0:
        os.chown(path, uid, uid)


def issue(out: Path, compose: dict, fleet_root: Path) -> list[str]:
    """Write every file; the NATS users issued."""
    out.mkdir(parents=True, exist_ok=True, mode=0o700)
    users = [(identity, _password(out / f"{identity.user}.nats")) for identity in identities(compose, fleet_root)]
    for identity, password in users:
        _write(out / f"{identity.user}.nats", password, WHALEFLUX_UID)
    _write(out / "nats.conf", 'listen: "0.0.0.0:4222"\nhttp_port: 8222\njetstream { store_dir: "/data" }\n'
           + nats_authorization(users), NATS_UID)
    redis = _password(out / "redis.password")
    _write(out / "redis.password", redis, WHALEFLUX_UID)
    _write(out / "redis.conf", f'requirepass "{redis}"\nappendonly yes\ndir /data\n', REDIS_UID)
    issue_http_tokens(out)
    return [identity.user for identity, _ in users]


def issue_http_tokens(out: Path) -> None:
    """tokens.json, admin.token, each calling component's <name>.token and console.admin; tokens already issued are
    kept (and the entries `whaleflux tokens issue` added to tokens.json)."""
    tokens = {"admin": _password(out / "admin.token")} | {name: _password(out / f"{name}.token")
                                                           for name in SERVICE_LINKS}
    for name, token in tokens.items():
        _write(out / f"{name}.token", token, WHALEFLUX_UID)
    _write(out / "console.admin", _password(out / "console.admin"), WHALEFLUX_UID)
    ours = [access.TokenEntry(name="admin", role="admin", sha256=access.hash_token(tokens["admin"]))]
    ours += [access.TokenEntry(name=name, role="viewer", services=list(peers), sha256=access.hash_token(tokens[name]))
             for name, peers in SERVICE_LINKS.items()]
    path = out / "tokens.json"
    kept = access.read_tokens(path, owners={WHALEFLUX_UID}).tokens  # this tool gave the file to the services' user
    others = [e for e in kept if e.name not in {o.name for o in ours}]
    access.write_tokens(path, access.TokenFile(tokens=ours + others))
    if os.geteuid() == 0:
        os.chown(path, WHALEFLUX_UID, WHALEFLUX_UID)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", type=Path, default=ROOT / "deploy" / "secrets")
    parser.add_argument("--compose", type=Path, default=ROOT / "docker-compose.yml")
    args = parser.parse_args(argv)
    users = issue(args.out, yaml.safe_load(args.compose.read_text()), ROOT)
    print(f"issued NATS users {', '.join(users)} and the Redis password into {args.out} (mode 0600)")
    if os.geteuid() != 0:
        print("not root: the files belong to you; on Linux run it with sudo so that each belongs to the container "
              "user that reads it (redis 999, whaleflux 10001)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
