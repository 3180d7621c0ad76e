"""Run the agent's NVML backend on this machine's real GPUs for 30 s and print what it collected.

For a session with an NVIDIA GPU: `python scripts/nvml_probe.py [--seconds 30] [--interval 1]`.
Needs only the NVIDIA driver (libnvidia-ml), no NATS or Redis: it calls the
backend directly, as the agent's telemetry loop does, and prints the
identities, then per GPU which metrics were reported and which were omitted
as unsupported, the last sample in full, and any XIDs seen.
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import UTC, datetime

from whaleflux.agent.nvml import NvmlBackend


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--interval", type=float, default=1.0)
    args = ap.parse_args()
    backend = NvmlBackend()
    print("identities:")
    for ident in backend.identities():
        print("  " + ident.model_dump_json())
    samples, costs = [], []
    xids: dict[str, list[int]] = {}
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        t = time.perf_counter()
        batch = backend.sample(datetime.now(UTC))
        costs.append(time.perf_counter() - t)
        samples.append(batch)
        for s in batch:
            if s.xid_errors:
                xids.setdefault(s.uuid, []).extend(s.xid_errors)
        time.sleep(max(0.0, args.interval - costs[-1]))
    print(f"\n{len(samples)} samples; sample() took {1000 * sum(costs) / len(costs):.1f} ms on average, "
          f"{1000 * max(costs):.1f} ms at most")
    for s in samples[-1]:
        doc = s.model_dump(mode="json")
        reported = sorted(k for k, v in doc.items() if v not in (None, []))
        omitted = sorted(k for k, v in doc.items() if v is None)
        util = [x.utilization_gpu_pct for b in samples for x in b if x.uuid == s.uuid]
        print(f"\nGPU {s.index} {s.model} {s.uuid}")
        print(f"  reported: {', '.join(reported)}")
        print(f"  omitted (not supported): {', '.join(omitted) or '-'}")
        print(f"  utilization over the run: min {min(util):.0f} %, max {max(util):.0f} %")
        print("  last sample: " + json.dumps(doc))
    print(f"\nXIDs: {xids or 'none'}")
    backend.close()


if __name__ == "__main__":
    main()
