"""What the telemetry benchmarks share: servers, a telemetry process, pre-encoded node batches."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import httpx

from whaleflux.agent.simulated import SimulatedNode
from whaleflux.servers import LocalServers, free_port
from whaleflux.shared import subjects
from whaleflux.shared.catalog import gpu_models
from whaleflux.shared.events import GpuTelemetry, NodeRegistered, encode, make_envelope

SEQ_MARK = 987654321
TIME_MARK = "2000-01-01T00:00:00Z"


def start_servers() -> LocalServers:
    return LocalServers(
        Path(tempfile.mkdtemp(prefix="wf-bench-")), "whaleflux", secrets.token_urlsafe(16), secrets.token_urlsafe(16)
    ).start()


def server_env(servers: LocalServers) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WHALEFLUX_", "NATS_", "REDIS_"))}
    env.update(
        NATS_URL=servers.nats_url,
        REDIS_URL=servers.redis_url,
        WHALEFLUX_NATS_USER=servers.nats_user,
        WHALEFLUX_NATS_PASSWORD=servers.nats_password,
        WHALEFLUX_REDIS_PASSWORD=servers.redis_password,
        WHALEFLUX_LOG_LEVEL="warning",
    )
    return env


@dataclass
class TelemetryProc:
    popen: subprocess.Popen
    url: str

    def stored(self) -> float:
        m = re.search(
            r"^whaleflux_telemetry_gpu_samples_stored_total (\S+)$",
            httpx.get(self.url + "/metrics", timeout=30).text,
            re.M,
        )
        return float(m.group(1)) if m else 0.0

    def stop(self) -> None:
        self.popen.terminate()
        self.popen.wait(15)


def start_telemetry(servers: LocalServers) -> TelemetryProc:
    port = free_port()
    env = {**server_env(servers), "WHALEFLUX_HTTP_PORT": str(port)}
    popen = subprocess.Popen(
        [sys.executable, "-m", "whaleflux", "service", "telemetry"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                return TelemetryProc(popen, url)
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit("telemetry service not ready in 60 s")


@dataclass
class NodeTemplate:
    node: str
    subject: str
    registration: NodeRegistered
    template: bytes  # an encoded gpu.telemetry envelope with SEQ_MARK and TIME_MARK to fill in

    def batch(self, seq: int, sample_time: str) -> bytes:
        return self.template.replace(str(SEQ_MARK).encode(), str(seq).encode(), 1).replace(
            TIME_MARK.encode(), sample_time.encode()
        )


def node_templates(n: int, gpus: int = 8) -> list[NodeTemplate]:
    """`n` simulated H100 nodes, each with one realistic 8-GPU batch (a job on half the GPUs)."""
    out = []
    model = gpu_models()["H100"]
    t = datetime(2000, 1, 1, tzinfo=UTC)
    for i in range(n):
        name = f"bench-{i:05d}"
        sim = SimulatedNode(name, model, gpus, interconnect="nvlink")
        sim.job_started([g.uuid for g in sim.identities()[: gpus // 2]], f"job-{i}", pid=1000 + i)
        batch = GpuTelemetry(cluster="bench", node=name, seq=SEQ_MARK, sample_time=t, gpus=sim.sample(t))
        env = make_envelope(batch, source=f"whaleflux/agent/bench/{name}", time=t)
        raw = encode(env).replace(b"2000-01-01T00:00:00Z", TIME_MARK.encode())
        out.append(
            NodeTemplate(
                name,
                subjects.gpu_telemetry("bench", name),
                NodeRegistered(cluster="bench", node=name, agent_version="bench", gpus=sim.identities()),
                raw,
            )
        )
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class CpuMeter:
    """CPU used by named processes between `start()` and `stop()`: robust to other load on the machine, unlike rates."""

    pids: dict[str, int]

    def start(self) -> CpuMeter:
        self.t0, self.c0 = time.monotonic(), {n: cpu_seconds(p) for n, p in self.pids.items()}
        return self

    def stop(self) -> dict[str, float]:
        """name -> CPU seconds used since start (and "_wall": elapsed seconds)."""
        used = {n: cpu_seconds(p) - self.c0[n] for n, p in self.pids.items()}
        return {**used, "_wall": time.monotonic() - self.t0}


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")
