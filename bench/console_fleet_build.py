"""The console's fleet view at 1,000 nodes x 8 GPUs, in process: CPU per folded message and per view build.

    python bench/console_fleet_build.py [--nodes 1000] [--rounds 10]

No servers: the messages are the agent's own `gpu.telemetry` envelopes (telemetry_harness's node templates, the
simulator's samples), fed to the console's FleetState as the bus would; a build is what the live hub runs once a
second for an open fleet page (fleet_view + its two frames: the node table and the heat map). Two cases: every node
sent a new sample since the last build (agents at 1 Hz), and a fifth did (agents every 5 s). CPU time
(time.process_time), so the figure is the console's own cost, not the machine's load; the reference is the one
second a build may take at most.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

from telemetry_harness import iso, node_templates  # noqa: E402

import whaleflux.console.app  # noqa: E402, F401 - registers the templates' filters
from whaleflux.console.fleetstate import FleetState  # noqa: E402
from whaleflux.console.pages.fleet import fleet_frames, fleet_view  # noqa: E402


class Scheduler:
    """The scheduler's /v1/nodes, answered in process."""

    def __init__(self, nodes: list[str]):
        self.answer = [{"node": n, "cluster": "bench", "gpus": 8, "free": 4, "status": "healthy"} for n in nodes]

    async def get(self, service: str, path: str, /, **params: object) -> object:
        return self.answer


class Console:
    def __init__(self, fleet: FleetState):
        self.fleet = fleet


async def run(nodes: int, rounds: int) -> None:
    templates = node_templates(nodes)
    state = FleetState(Scheduler([t.node for t in templates]))  # type: ignore[arg-type]
    state.details_at = time.monotonic()  # as if telemetry's /v1/gpus had been read (empty)
    console = Console(state)
    seq = 0

    def feed(share: float) -> float:
        nonlocal seq
        seq += 1
        stamp = iso(time.time())
        batch = [t.batch(seq, stamp) for t in templates[: max(1, int(len(templates) * share))]]
        started = time.process_time()
        for raw in batch:
            state.on_telemetry(raw)
        return (time.process_time() - started) / len(batch)

    async def build() -> tuple[float, int, int]:
        started = time.process_time()
        frames = fleet_frames(await fleet_view(console))  # type: ignore[arg-type]
        sent = dict(frames)  # the table, the heat map's layout (sent when it changes) and its cells (each time)
        return time.process_time() - started, len(sent["fleet"]), len(sent["heat"])

    feed(1.0)
    await build()  # the first build makes every node's text
    print(f"# console fleet view, {nodes} nodes x 8 GPUs, in process, CPU time; {machine()}")
    for share, label in ((1.0, "every node new (1 Hz agents)"), (0.2, "a fifth new (5 s agents)")):
        per_msg, builds, sizes = [], [], (0, 0)
        for _ in range(rounds):
            per_msg.append(feed(share))
            cost, table, heat = await build()
            builds.append(cost)
            sizes = (table, heat)
        fold_s = statistics.median(per_msg) * nodes * share
        print(f"{label}: build median {1000 * statistics.median(builds):.0f} ms, max {1000 * max(builds):.0f} ms; "
              f"folding the messages {1000 * statistics.median(per_msg):.2f} ms each ({1000 * fold_s:.0f} ms a "
              f"second); node table {sizes[0] / 1e3:.0f} kB, heat map cells {sizes[1] / 1e3:.0f} kB; build + fold "
              f"{1000 * (statistics.median(builds) + fold_s):.0f} ms of CPU a second   (reference: <= 1,000 ms, one "
              f"build a second)")


def machine() -> str:
    load = os.getloadavg()
    return (f"{os.cpu_count()} cores, load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}, "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args()
    asyncio.run(run(args.nodes, args.rounds))


if __name__ == "__main__":
    main()
