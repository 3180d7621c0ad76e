"""A short run of the noise benchmark (bench/alert_noise.py) as a regression guard for the noise guards.

Ten simulated minutes of the 256-GPU fleet under the varied job mix: nothing
pages; with the first fault of the benchmark (a cooling failure under load at
minute 8) that fault is paged within seconds, as one incident, and its node
drained. The full hour is `python bench/alert_noise.py` (bench/RESULTS.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import alert_noise  # noqa: E402


def test_ten_minutes_of_a_healthy_fleet_page_nobody_and_a_cooling_failure_pages_once(capsys):
    out, plan = alert_noise.run("healthy", 10, 1, alert_noise.DEFAULT_RULES_FILE, with_faults=False)
    figures = alert_noise.report(out, plan, 10)
    assert figures["pages"] == 0 and out.raised == 0
    assert out.samples >= 256 * 600 - 10 and len(out.jobs) == 4  # every workload class ran

    out, plan = alert_noise.run("faults", 10, 1, alert_noise.DEFAULT_RULES_FILE, with_faults=True)
    figures = alert_noise.report(out, plan, 10)
    printed = capsys.readouterr().out
    assert figures["faults_paged"] == 1 and figures["one_incident_each"] == 1 and figures["false_pages"] == 0, printed
    assert "[ok] cooling failure, one GPU (H100, under load) at 8 min" in printed
    assert [node for _, node, _ in out.drains] == [plan[0].node]
