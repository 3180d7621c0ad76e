"""Issue the Secrets of the Kubernetes deployment into deploy/kubernetes/secrets/secrets.yaml (mode 0600).

    python deploy/kubernetes/issue_secrets.py --gpu-node gpu-node-01 --gpu-node gpu-node-02   # production
    python deploy/kubernetes/issue_secrets.py --simulate shared/data/fleets/small-demo.yaml  # overlays/dev
    kubectl apply -k deploy/kubernetes/overlays/production   # the namespaces; pods wait for their Secrets
    kubectl apply -f deploy/kubernetes/secrets/secrets.yaml

From the permission table of shared/permissions.py: one NATS user per component (`whaleflux-nats-<user>`,
key `password`), the nats-server `authorization` block with every user and its permissions
(`whaleflux-nats-auth`, key `auth.conf`, included by the servers' config), the Redis password
(`whaleflux-redis`), the people's admin token with the tokens file every pod reads (`whaleflux-admin`, keys
`token`, for people only, no pod mounts it, and `tokens.json`, the hashes, alone in the agents' namespace),
each calling component's own token (`whaleflux-token-<name>`, key `token`, a viewer accepted only by the
services it calls: the console's for its background reads, with the console's own admin token as key `admin`)
and the agents' identity (`whaleflux-nats-agents` in whaleflux-agents), allowed the subjects of the GPU nodes
named and no others. Every pod mounts only its own as files; no secret is in a manifest or an environment
variable. Passwords already issued are kept: run it again after adding a GPU node, apply, then restart the NATS
servers one at a time (`kubectl -n whaleflux rollout restart statefulset/nats`) so that they read the new user
list.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from pathlib import Path
from typing import Any

import yaml

from whaleflux.local import SERVICE_LINKS
from whaleflux.shared import access
from whaleflux.shared.catalog import load_fleet
from whaleflux.shared.permissions import Identity, nats_authorization, stack_identities
from whaleflux.shared.subjects import token

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE, AGENTS_NAMESPACE = "whaleflux", "whaleflux-agents"
AGENTS_USER = "agents"  # agent.yaml's WHALEFLUX_NATS_USER


def _secret(name: str, namespace: str, data: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {"app.kubernetes.io/part-of": "whaleflux"}},
            "stringData": data}


def _issued(path: Path) -> dict[tuple[str, str], dict[str, str]]:
    """What an earlier run issued, by (namespace, name)."""
    if not path.exists():
        return {}
    return {(doc["metadata"]["namespace"], doc["metadata"]["name"]): doc["stringData"]
            for doc in yaml.safe_load_all(path.read_text()) if doc}


def secrets_for(agent_nodes: list[tuple[str, str]], issued: dict[tuple[str, str], dict[str, str]]
                ) -> list[dict[str, Any]]:
    """Every Secret of the deployment; values already in `issued` are kept, the rest are new."""
    def value(namespace: str, name: str, key: str) -> str:
        return issued.get((namespace, name), {}).get(key) or secrets.token_urlsafe(32)

    identities: list[Identity] = stack_identities(agent_nodes, AGENTS_USER)
    users: list[tuple[Identity, str]] = []
    out = []
    for identity in identities:
        namespace = AGENTS_NAMESPACE if identity.user == AGENTS_USER else NAMESPACE
        name = f"whaleflux-nats-{identity.user}"
        password = value(namespace, name, "password")
        users.append((identity, password))
        out.append(_secret(name, namespace, {"password": password}))
    out.append(_secret("whaleflux-nats-auth", NAMESPACE, {"auth.conf": nats_authorization(users)}))
    out.append(_secret("whaleflux-redis", NAMESPACE, {"password": value(NAMESPACE, "whaleflux-redis", "password")}))
    admin = value(NAMESPACE, "whaleflux-admin", "token")
    callers = {name: value(NAMESPACE, f"whaleflux-token-{name}", "token") for name in SERVICE_LINKS}
    tokens = access.TokenFile(tokens=[
        access.TokenEntry(name="admin", role="admin", sha256=access.hash_token(admin)),
        *(access.TokenEntry(name=name, role="viewer", services=list(SERVICE_LINKS[name]),
                            sha256=access.hash_token(token)) for name, token in callers.items())])
    hashes = tokens.model_dump_json(indent=2, exclude_none=True)
    # The people's admin token is for people (kubectl reads it here); pods mount only tokens.json, and the GPU
    # nodes' namespace never holds the token.
    out += [_secret("whaleflux-admin", NAMESPACE, {"token": admin, "tokens.json": hashes}),
            _secret("whaleflux-admin", AGENTS_NAMESPACE, {"tokens.json": hashes})]
    # The console's own admin token beside its reader token (its pod mounts only tokens.json of whaleflux-admin).
    own = {"console": {"admin": value(NAMESPACE, "whaleflux-token-console", "admin")}}
    out += [_secret(f"whaleflux-token-{name}", NAMESPACE, {"token": token, **own.get(name, {})})
            for name, token in callers.items()]
    return out


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(path, 0o600)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    nodes = parser.add_mutually_exclusive_group(required=True)
    nodes.add_argument("--gpu-node", action="append", metavar="NODE",
                       help="a GPU node's Kubernetes name (its agent's node name); repeat for each")
    nodes.add_argument("--simulate", type=Path, metavar="FLEET", help="the fleet file overlays/dev simulates")
    parser.add_argument("--cluster", default="onprem", help="the agents' WHALEFLUX_CLUSTER (agent.yaml)")
    parser.add_argument("--out", type=Path, default=ROOT / "deploy" / "kubernetes" / "secrets" / "secrets.yaml")
    args = parser.parse_args(argv)
    if args.simulate:
        agent_nodes = [(node.cluster, node.name) for node in load_fleet(args.simulate).nodes()]
    else:
        agent_nodes = [(args.cluster, token(node)) for node in args.gpu_node]
    docs = secrets_for(agent_nodes, _issued(args.out))
    _write_private(args.out, yaml.safe_dump_all(docs, sort_keys=False))
    print(f"issued {len(docs)} Secrets (agents of {len(agent_nodes)} nodes) into {args.out} (mode 0600); "
          f"apply with: kubectl apply -f {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
