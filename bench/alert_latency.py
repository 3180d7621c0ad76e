"""Detection latency: a sample crossing a threshold -> a local HTTP receiver has the POST, under telemetry load.

Starts its own nats-server and redis-server, the alerting service with a
rules file holding the thermal rule (`for: 0`) and one webhook route
(`group_wait: 0`), a receiver on 127.0.0.1, and a load of GPUS GPUs at 1 Hz
(GPUS / 8 nodes, spread over each second) from a second process. Each trial
publishes one hot sample for a fresh GPU and times its arrival at the receiver.

    python bench/alert_latency.py [--gpus 2000] [--trials 40] [--warmup 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))

import httpx  # noqa: E402
from telemetry_harness import server_env, start_servers  # noqa: E402
from telemetry_latency import _load  # noqa: E402

from whaleflux.servers import QuietHandler, free_port, serve_http  # noqa: E402
from whaleflux.shared import subjects  # noqa: E402
from whaleflux.shared.bus import Bus  # noqa: E402
from whaleflux.shared.events import GpuSample, GpuTelemetry  # noqa: E402

RULES = """
rules:
  - name: GPUTemperatureHigh
    kind: threshold
    metric: temperature_c
    threshold: {device: slowdown_temperature_c, model: temp_slowdown_c}
    hysteresis: 3
    for: 0s
    severity: critical
    category: thermal
    summary: "GPU {gpu} ({uuid}) on {node} at {value:.0f} C"
route:
  receiver: hook
  group_by: [alertname, UUID]
  group_wait: 0s
  group_interval: 5s
receivers:
  - {name: hook, type: webhook, url: "%s"}
"""


def _shipped_rules() -> int:
    from whaleflux.alerting.config import DEFAULT_RULES_FILE, load_config

    return len(load_config(DEFAULT_RULES_FILE).rules)


class Receiver:
    def __init__(self) -> None:
        self.arrivals: dict[str, float] = {}
        me = self

        class Handler(QuietHandler):
            def do_POST(self):  # noqa: N802
                now = time.time()
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                for a in body["alerts"]:
                    if a["status"] == "firing":
                        me.arrivals.setdefault(a["labels"]["UUID"], now)
                self.send_response(200)
                self.end_headers()

        self.server = serve_http(Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"


async def _trials(servers, trials: int, gap_s: float) -> dict[str, float]:
    bus = await Bus.connect(servers.nats_url, source="bench", user=servers.nats_user, password=servers.nats_password)
    sent: dict[str, float] = {}
    try:
        for i in range(trials):
            uuid = f"GPU-probe-{i:04d}-{time.time_ns()}"
            t0 = time.time()
            sample = GpuSample(uuid=uuid, index=0, model="H100", utilization_gpu_pct=90, memory_used_mib=1000,
                               memory_total_mib=81559, temperature_c=95.0)
            data = GpuTelemetry(cluster="bench", node=f"probe-{i % 4}", seq=i,
                                sample_time=datetime.fromtimestamp(t0, UTC), gpus=[sample])
            await bus.publish(subjects.gpu_telemetry("bench", f"probe-{i % 4}"), data)
            sent[uuid] = t0
            await asyncio.sleep(gap_s)
    finally:
        await bus.close()
    return sent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--gpus", type=int, default=2000)
    ap.add_argument("--trials", type=int, default=40)
    ap.add_argument("--gap", type=float, default=0.5, help="seconds between hot samples")
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--default-rules", action="store_true", help="all shipped rules instead of the thermal rule alone")
    args = ap.parse_args()

    servers = start_servers()
    receiver = Receiver()
    rules = Path(tempfile.mkdtemp(prefix="wf-alert-bench-")) / "rules.yaml"
    rules.write_text(RULES % receiver.url)
    port = free_port()
    env = {**server_env(servers), "WHALEFLUX_HTTP_PORT": str(port), "WHALEFLUX_ALERTING_RULES_FILE": str(rules)}
    if args.default_rules:
        env.pop("WHALEFLUX_ALERTING_RULES_FILE")
        env["WHALEFLUX_ALERTING_WEBHOOK_URLS"] = receiver.url
    svc = subprocess.Popen([sys.executable, "-m", "whaleflux", "service", "alerting"], env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    load = None
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        seconds = args.warmup + args.trials * args.gap + 10
        ready, go = mp.Event(), mp.Event()
        if args.gpus > 0:
            load = mp.Process(target=_load, args=(servers.nats_url, servers.nats_user, servers.nats_password,
                                                   args.gpus // 8, seconds, ready, go))
            load.start()
            ready.wait(30)
        go.set()
        time.sleep(args.warmup)
        sent = asyncio.run(_trials(servers, args.trials, args.gap))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and len(receiver.arrivals) < len(sent):
            time.sleep(0.1)
        lat = sorted((receiver.arrivals[u] - t0) * 1000 for u, t0 in sent.items() if u in receiver.arrivals)
        missing = len(sent) - len(lat)
        p = lambda q: lat[min(len(lat) - 1, int(round(q * (len(lat) - 1))))] if lat else float("nan")  # noqa: E731
        print(json.dumps({
            "rules": f"default ({_shipped_rules()})" if args.default_rules else "thermal only",
            "background_gpus_1hz": args.gpus, "trials": len(sent), "missing": missing,
            "p50_ms": round(p(0.5), 1), "p90_ms": round(p(0.9), 1), "p99_ms": round(p(0.99), 1),
            "max_ms": round(lat[-1], 1) if lat else None, "mean_ms": round(statistics.mean(lat), 1) if lat else None,
        }))
    finally:
        if load is not None:
            load.join(5)
            if load.is_alive():
                load.terminate()
        svc.terminate()
        try:
            svc.wait(15)
        except subprocess.TimeoutExpired:
            svc.kill()
            svc.wait()
        servers.stop()


if __name__ == "__main__":
    main()
