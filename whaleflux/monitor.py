"""`whaleflux monitor`: one row per GPU from the telemetry service, hot/throttled/erroring ones highlighted."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from whaleflux.shared.fleet_health import fleet_health

from .client import ClientError, Connection

SEVERE = {"stale", "xid", "ecc"}
WARN = {"hot", "throttled", "nvlink", "mem_full"}


def select(gpus: list[dict], gpu: str = "all") -> list[dict]:
    """`all`, a GPU index (on every node shown), or a UUID (or its prefix)."""
    if gpu == "all":
        return gpus
    if gpu.isdigit():
        return [g for g in gpus if g["gpu"]["index"] == int(gpu)]
    return [g for g in gpus if g["gpu"]["uuid"].startswith(gpu)]


def _gb(mib: float) -> str:
    return f"{mib / 1024:.0f}"


def row_style(flags: list[str]) -> str | None:
    if SEVERE & set(flags):
        return "bold red"
    if WARN & set(flags):
        return "yellow"
    return None


def build_table(gpus: list[dict], title: str = "") -> Table:
    """The table for one refresh: GPU, model, util, temp, VRAM, power, job, flags."""
    table = Table(title=title, title_justify="left", expand=False)
    for col in ("node", "GPU", "model", "util", "temp", "VRAM GB", "power W", "job", "flags"):
        table.add_column(col, no_wrap=True, justify="right" if col in ("util", "temp", "power W") else "left")
    for st in gpus:
        g = st["gpu"]
        job = st.get("job")
        job_text = ""
        if job:
            job_text = (job.get("name") or job["job_id"])[:24] + (f" ({job['team']})" if job.get("team") else "")
        limit = f"/{g['power_limit_w']:.0f}" if g.get("power_limit_w") else ""
        power = "" if g.get("power_w") is None else f"{g['power_w']:.0f}" + limit
        flags = list(st.get("flags", []))
        if "stale" in flags:
            flags[flags.index("stale")] = f"stale {st['age_s']:.0f}s"
        if st.get("last_xid"):
            flags = [f"xid {st['last_xid']}" if f == "xid" else f for f in flags]
        table.add_row(
            st["node"], f"GPU{g['index']}", g["model"], f"{g['utilization_gpu_pct']:.0f}%",
            f"{g['temperature_c']:.0f}°C",
            f"{_gb(g['memory_used_mib'])}/{_gb(g['memory_total_mib'])}", power, job_text, Text(" ".join(flags)),
            style=row_style(st.get("flags", [])),
        )
    return table


def health_line(gpus: list[dict]) -> str:
    """What the GPUs shown add up to: `unknown` when none reported within the freshness window, never `healthy`."""
    stale = sum(1 for g in gpus if "stale" in g.get("flags", []))
    troubled = sum(1 for g in gpus if (SEVERE | WARN) - {"stale"} & set(g.get("flags", [])))
    word = fleet_health(len(gpus), stale, troubled)
    return f"{word} (no sample within the freshness window)" if word == "unknown" and gpus else word


def fetch(conn: Connection, node: str | None, gpu: str) -> list[dict]:
    return select(conn.get("telemetry", "/v1/gpus", node=node), gpu)  # type: ignore[arg-type]


def _view(conn: Connection, node: str | None, gpu: str) -> Any:
    try:
        gpus = fetch(conn, node, gpu)
    except ClientError as exc:
        return Text(f"error: {exc}", style="red")
    flagged = sum(1 for g in gpus if g.get("flags"))
    title = (f"{health_line(gpus)}: {len(gpus)} GPUs, {flagged} flagged  ·  {time.strftime('%H:%M:%S')}"
             "  ·  Ctrl-C to stop")
    if not gpus:
        return Group(Text(title), Text("no GPU samples yet (is an agent running?)", style="yellow"))
    return build_table(gpus, title)


def run(node: str | None, gpu: str, watch: bool, interval_s: float, console: Console) -> int:
    """Print the table once, or refresh it in place every `interval_s` until Ctrl-C."""
    conn = Connection.discover()
    if not watch:
        gpus = fetch(conn, node, gpu)
        if not gpus:
            console.print("no GPU samples" + (f" from node {node!r}" if node else "")
                          + (f" for GPU {gpu!r}" if gpu != "all" else ""))
            return 1
        console.print(build_table(gpus, title=health_line(gpus)))
        return 0
    try:
        with Live(_view(conn, node, gpu), console=console, refresh_per_second=4, screen=False) as live:
            while True:
                time.sleep(interval_s)
                live.update(_view(conn, node, gpu))
    except KeyboardInterrupt:
        return 0
