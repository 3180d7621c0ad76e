"""Detection latency: a sample crossing a threshold -> a local HTTP receiver has the POST, under telemetry load.

Starts its own nats-server and redis-server, the alerting service with a
rules file holding the thermal rule (`for: 0`) and one webhook route
(`group_wait: 0`), a receiver on 127.0.0.1, and a load of GPUS GPUs at 1 Hz
(GPUS / 8 nodes, spread over each second) from a second process. Each trial
publishes one hot sample for a fresh GPU and times its arrival at the receiver.

`--stages` keeps the service's log and splits each trial's latency into the
path's stages, from the service's own log lines (their times are the
service's clock, the same machine's): `rule` (sample time -> `alert.raised`
logged: consumer fetch, rules, the MULTI), `bus` (-> the `alerting-notify`
consumer handled the alert event: outbox publish, JetStream, fetch, grouping,
its MULTI), `post` (-> the receiver has the POST: delivery loop, render, HTTP).

    python bench/alert_latency.py [--gpus 2000] [--trials 40] [--warmup 5] [--stages]
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


def _stages(log_path: Path, sent: dict[str, float], arrivals: dict[str, float]) -> dict[str, dict[str, float]]:
    """p50 / p99 / max of each stage over the trials, from the service's log lines (see the module's doc)."""
    raised: dict[str, tuple[str, float]] = {}  # uuid -> (fingerprint, when alert.raised was logged)
    notified: dict[str, float] = {}  # fingerprint -> when alerting-notify handled its alert.raised
    for line in log_path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        when = datetime.fromisoformat(str(rec.get("timestamp", "")).replace("Z", "+00:00")).timestamp() \
            if rec.get("timestamp") else None
        if when is None:
            continue
        if rec.get("event") == "alert.raised":
            uuid = next((u for u in sent if u in str(rec.get("summary", ""))), None)
            if uuid is not None:
                raised.setdefault(uuid, (str(rec["fingerprint"]), when))
        elif rec.get("event") == "event.handled" and rec.get("consumer") == "alerting-notify":
            fp = str(rec.get("event_id", "")).removeprefix("raised-").rsplit("-", 1)[0]
            notified.setdefault(fp, when)
    spans: dict[str, list[float]] = {"rule": [], "bus": [], "post": []}
    for uuid, t0 in sent.items():
        if uuid not in raised or uuid not in arrivals or raised[uuid][0] not in notified:
            continue
        fp, t_raised = raised[uuid]
        spans["rule"].append(t_raised - t0)
        spans["bus"].append(notified[fp] - t_raised)
        spans["post"].append(arrivals[uuid] - notified[fp])

    def summary(xs: list[float]) -> dict[str, float]:
        xs = sorted(x * 1000 for x in xs)
        at = lambda q: xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]  # noqa: E731
        return {"n": len(xs), "p50": round(at(0.5), 1), "p99": round(at(0.99), 1), "max": round(xs[-1], 1)} \
            if xs else {"n": 0}

    return {k: summary(v) for k, v in spans.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--gpus", type=int, default=2000)
    ap.add_argument("--trials", type=int, default=40)
    ap.add_argument("--gap", type=float, default=0.5, help="seconds between hot samples")
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--default-rules", action="store_true", help="all shipped rules instead of the thermal rule alone")
    ap.add_argument("--stages", action="store_true", help="split the latency into the path's stages (service log)")
    args = ap.parse_args()

    servers = start_servers()
    receiver = Receiver()
    rules = Path(tempfile.mkdtemp(prefix="wf-alert-bench-")) / "rules.yaml"
    rules.write_text(RULES % receiver.url)
    port = free_port()
    env = {**server_env(servers), "WHALEFLUX_HTTP_PORT": str(port), "WHALEFLUX_ALERTING_RULES_FILE": str(rules)}
    if args.stages:
        env["WHALEFLUX_LOG_LEVEL"] = "info"  # the lines the stages are read from (one per event: some cost)
    if args.default_rules:
        env.pop("WHALEFLUX_ALERTING_RULES_FILE")
        env["WHALEFLUX_ALERTING_WEBHOOK_URLS"] = receiver.url
    log_path = rules.parent / "alerting.log"
    with open(log_path, "wb") if args.stages else open(os.devnull, "wb") as out:
        svc = subprocess.Popen([sys.executable, "-m", "whaleflux", "service", "alerting"], env=env,
                               stdout=out, stderr=subprocess.STDOUT)
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
        figures = {
            "rules": f"default ({_shipped_rules()})" if args.default_rules else "thermal only",
            "background_gpus_1hz": args.gpus, "trials": len(sent), "missing": missing,
            "p50_ms": round(p(0.5), 1), "p90_ms": round(p(0.9), 1), "p99_ms": round(p(0.99), 1),
            "max_ms": round(lat[-1], 1) if lat else None, "mean_ms": round(statistics.mean(lat), 1) if lat else None,
            "load_average": [round(x, 2) for x in os.getloadavg()],
        }
        if args.stages:
            figures["stages_ms"] = _stages(log_path, sent, receiver.arrivals)
        print(json.dumps(figures))
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
