"""Same fault, two stacks: dcgm-exporter -> Prometheus -> Alertmanager vs WhaleFlux.

Fault: one GPU's temperature switches from 40 C to 95 C at a recorded instant.
Figure: seconds from that instant (the first faulty sample) until a local HTTP receiver has the POST: p50,
p99 and max of each stack, side by side from the same run, with the machine's load average (a busy machine
slows all of them).

Prometheus stack (real /usr/bin/prometheus and prometheus-alertmanager, temp
configs and data dirs, free ports on 127.0.0.1; Alertmanager clustering off):
  - a tiny exporter in this process serving dcgm-exporter text
    `DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID=...,Hostname="node-a",modelName=...} <temp>`;
  - rule `DCGM_FI_DEV_GPU_TEMP > 89`, `for: 0s`;
  - route group_by [alertname, UUID] -> webhook receiver in this process.
  Two settings:
  - "common": scrape_interval 15s, evaluation_interval 15s (the usual
    dcgm-exporter setup; Prometheus's own defaults are 1m, which is slower),
    group_wait 30s (Alertmanager's default);
  - "aggressive": scrape 1s, evaluation 1s, group_wait 0s (the floor of the
    architecture).
  Each trial uses a fresh GPU UUID (so a fresh alert group), waits until
  Prometheus has stored it at 40 C, then waits a random 0..scrape_interval (a
  fault does not line up with the scrape) and switches it to 95 C.
  dcgm-exporter's own collect interval (DCGM_EXPORTER_INTERVAL, 30 s default)
  is NOT modelled: the exporter here answers the live value on every scrape,
  so the figures are a lower bound for a default deployment.

WhaleFlux: bench/alert_latency.py run as a subprocess with no background load.

    python bench/alert_stack_compare.py [--trials 3] [--fast-trials 5] [--wf-trials 20]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))

from whaleflux.servers import QuietHandler, free_port, serve_http  # noqa: E402

HERE = Path(__file__).resolve().parent
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
ALERTMANAGER = (shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
                or "/usr/bin/prometheus-alertmanager")
MODEL = "NVIDIA H100 80GB HBM3"


class Exporter:
    """dcgm-exporter-style /metrics; one series per UUID, value switchable."""

    def __init__(self) -> None:
        self.temps: dict[str, float] = {}
        self.lock = threading.Lock()
        me = self

        class Handler(QuietHandler):
            def do_GET(self):  # noqa: N802
                with me.lock:
                    items = list(me.temps.items())
                lines = ["# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).",
                         "# TYPE DCGM_FI_DEV_GPU_TEMP gauge"]
                for uuid, t in items:
                    lines.append(f'DCGM_FI_DEV_GPU_TEMP{{gpu="0",UUID="{uuid}",Hostname="node-a",'
                                 f'modelName="{MODEL}"}} {t:g}')
                body = ("\n".join(lines) + "\n").encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = serve_http(Handler)
        self.port = self.server.server_port

    def set(self, uuid: str, temp: float | None) -> float:
        with self.lock:
            if temp is None:
                self.temps.pop(uuid, None)
            else:
                self.temps[uuid] = temp
            return time.time()


class Receiver:
    """Alertmanager webhook receiver; first firing arrival per UUID."""

    def __init__(self) -> None:
        self.arrivals: dict[str, float] = {}
        self.cv = threading.Condition()
        me = self

        class Handler(QuietHandler):
            def do_POST(self):  # noqa: N802
                now = time.time()
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with me.cv:
                    for a in body.get("alerts", []):
                        if a.get("status") == "firing":
                            me.arrivals.setdefault(a["labels"].get("UUID", ""), now)
                    me.cv.notify_all()
                self.send_response(200)
                self.end_headers()

        self.server = serve_http(Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"

    def wait(self, uuid: str, timeout: float) -> float | None:
        deadline = time.monotonic() + timeout
        with self.cv:
            while uuid not in self.arrivals:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.cv.wait(left)
            return self.arrivals[uuid]


def _get(url: str, timeout: float = 2.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 (local)
        return r.read()


def _wait_ready(url: str, proc: subprocess.Popen, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            _get(url)
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{what} not ready after {timeout}s")


def _stop(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _p99(xs: list[float]) -> float:
    """The 99th percentile (nearest rank): with fewer than 100 trials, the slowest but one in a hundred."""
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, max(0, -(-99 * len(ordered) // 100) - 1))]


def _stats(xs: list[float]) -> dict:
    if not xs:
        return {"n": 0}
    return {"n": len(xs), "min_s": round(min(xs), 2), "median_s": round(statistics.median(xs), 2),
            "p99_s": round(_p99(xs), 2), "max_s": round(max(xs), 2)}


def prometheus_stack(name: str, scrape_s: int, eval_s: int, group_wait: str, trials: int,
                     exporter: Exporter, receiver: Receiver, timeout_s: float) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix=f"wf-promstack-{name}-"))
    prom_port, am_port = free_port(), free_port()
    (tmp / "rules.yml").write_text(f"""groups:
  - name: gpu
    interval: {eval_s}s
    rules:
      - alert: GPUTemperatureHigh
        expr: DCGM_FI_DEV_GPU_TEMP > 89
        for: 0s
        labels: {{severity: critical}}
        annotations: {{summary: "GPU {{{{ $labels.UUID }}}} on {{{{ $labels.Hostname }}}} at {{{{ $value }}}} C"}}
""")
    (tmp / "prometheus.yml").write_text(f"""global:
  scrape_interval: {scrape_s}s
  evaluation_interval: {eval_s}s
rule_files: ["{tmp / 'rules.yml'}"]
alerting:
  alertmanagers:
    - static_configs: [{{targets: ["127.0.0.1:{am_port}"]}}]
scrape_configs:
  - job_name: dcgm
    static_configs: [{{targets: ["127.0.0.1:{exporter.port}"]}}]
""")
    (tmp / "alertmanager.yml").write_text(f"""route:
  receiver: hook
  group_by: [alertname, UUID]
  group_wait: {group_wait}
  group_interval: 5m
  repeat_interval: 4h
receivers:
  - name: hook
    webhook_configs: [{{url: "{receiver.url}", send_resolved: false}}]
""")
    prom = am = None
    log_p, log_a = open(tmp / "prometheus.log", "w"), open(tmp / "alertmanager.log", "w")
    lat: list[float] = []
    missing = 0
    try:
        am = subprocess.Popen([ALERTMANAGER, f"--config.file={tmp / 'alertmanager.yml'}",
                               f"--storage.path={tmp / 'am-data'}", f"--web.listen-address=127.0.0.1:{am_port}",
                               "--cluster.listen-address="], stdout=log_a, stderr=subprocess.STDOUT)
        prom = subprocess.Popen([PROMETHEUS, f"--config.file={tmp / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={tmp / 'prom-data'}",
                                 f"--web.listen-address=127.0.0.1:{prom_port}"], stdout=log_p, stderr=subprocess.STDOUT)
        _wait_ready(f"http://127.0.0.1:{am_port}/-/ready", am, "alertmanager")
        _wait_ready(f"http://127.0.0.1:{prom_port}/-/ready", prom, "prometheus")
        for i in range(trials):
            uuid = f"GPU-{name}-{i}-{time.time_ns()}"
            exporter.set(uuid, 40.0)
            q = urllib.parse.quote(f'DCGM_FI_DEV_GPU_TEMP{{UUID="{uuid}"}}')
            deadline = time.monotonic() + 4 * scrape_s + 30
            while time.monotonic() < deadline:  # wait until Prometheus has the series at 40 C
                res = json.loads(_get(f"http://127.0.0.1:{prom_port}/api/v1/query?query={q}"))
                if res["data"]["result"]:
                    break
                time.sleep(0.2)
            else:
                raise RuntimeError("prometheus never scraped the exporter; see " + str(tmp))
            time.sleep(random.uniform(0, scrape_s))  # random phase of the fault vs the scrape
            t0 = exporter.set(uuid, 95.0)
            t1 = receiver.wait(uuid, timeout_s)
            if t1 is None:
                missing += 1
                print(f"  [{name}] trial {i + 1}: no POST within {timeout_s:.0f}s", flush=True)
            else:
                lat.append(t1 - t0)
                print(f"  [{name}] trial {i + 1}: {t1 - t0:.2f} s", flush=True)
            exporter.set(uuid, None)  # series goes stale, alert resolves (send_resolved off)
    finally:
        _stop(prom)
        _stop(am)
        log_p.close()
        log_a.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return {"stack": f"prometheus+alertmanager ({name})", "scrape_interval_s": scrape_s,
            "evaluation_interval_s": eval_s, "group_wait": group_wait, "missing": missing, **_stats(lat)}


def whaleflux(trials: int) -> dict:
    cmd = [sys.executable, str(HERE / "alert_latency.py"), "--gpus", "0", "--trials", str(trials),
           "--gap", "0.5", "--warmup", "2"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        raise RuntimeError(f"alert_latency.py failed ({p.returncode}): {p.stderr[-2000:]}")
    r = json.loads(lines[-1])
    return {"stack": "whaleflux (bench/alert_latency.py --gpus 0, thermal rule, for: 0s, group_wait: 0s)",
            "command": " ".join(["python", "bench/alert_latency.py"] + cmd[2:]), **r}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=3, help="trials of the common (15s/15s/30s) stack")
    ap.add_argument("--fast-trials", type=int, default=5, help="trials of the aggressive (1s/1s/0s) stack")
    ap.add_argument("--wf-trials", type=int, default=20, help="WhaleFlux trials")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    random.seed(args.seed)

    exporter, receiver = Exporter(), Receiver()
    results = []
    try:
        print("WhaleFlux ...", flush=True)
        results.append(whaleflux(args.wf_trials))
        print(json.dumps(results[-1]), flush=True)
        print("Prometheus stack, aggressive (scrape 1s, eval 1s, group_wait 0s) ...", flush=True)
        results.append(prometheus_stack("aggressive", 1, 1, "0s", args.fast_trials, exporter, receiver, 30))
        print(json.dumps(results[-1]), flush=True)
        print("Prometheus stack, common (scrape 15s, eval 15s, group_wait 30s) ...", flush=True)
        results.append(prometheus_stack("common", 15, 15, "30s", args.trials, exporter, receiver, 120))
        print(json.dumps(results[-1]), flush=True)
    finally:
        exporter.server.shutdown()
        receiver.server.shutdown()
    load = os.getloadavg()
    print(f"\nsummary (first faulty sample -> receiver has the POST), same run; load average "
          f"{load[0]:.1f} {load[1]:.1f} {load[2]:.1f} on {os.cpu_count()} CPUs:")
    print(f"  {'stack':<90} {'p50 s':>7} {'p99 s':>7} {'max s':>7}  n  missing")
    for r in results:
        if "median_s" in r:
            p50, p99, mx, n = r["median_s"], r["p99_s"], r["max_s"], r["n"]
        else:
            p50, p99, mx, n = r["p50_ms"] / 1000, r["p99_ms"] / 1000, r["max_ms"] / 1000, r["trials"]
        print(f"  {r['stack']:<90} {p50:>7.3f} {p99:>7.3f} {mx:>7.3f} {n:>3} {r['missing']:>4}")


if __name__ == "__main__":
    main()
