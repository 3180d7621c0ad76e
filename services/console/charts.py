"""GPU history as the columns uPlot draws: raw points (1 s) or minute rollups (their means)."""

from __future__ import annotations

from typing import Any

WINDOWS_S = {"15m": 900, "1h": 3600, "24h": 86400, "7d": 7 * 86400}


def series(points: list[dict[str, Any]], resolution: str) -> dict[str, list]:
    """`{t, util, temp, power, mem_gib}` columns; a metric a point lacks is null (a gap, not a zero)."""
    if resolution == "1m":
        keys = {"util": "util_mean", "temp": "temp_mean", "power": "power_mean", "mem": "mem_mean"}
    else:
        keys = {"util": "util", "temp": "temp_c", "power": "power_w", "mem": "mem_mib"}
    cols: dict[str, list] = {"t": [], "util": [], "temp": [], "power": [], "mem_gib": []}
    for p in points:
        cols["t"].append(p["t"])
        cols["util"].append(p.get(keys["util"]))
        cols["temp"].append(p.get(keys["temp"]))
        cols["power"].append(p.get(keys["power"]))
        mem = p.get(keys["mem"])
        cols["mem_gib"].append(None if mem is None else round(mem / 1024, 2))
    return cols
