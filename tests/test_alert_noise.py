"""A short run of the noise benchmark (bench/alert_noise.py) as a regression guard for the noise guards.

Ten simulated minutes of the 256-GPU fleet under the varied job mix, with the
first fault of the benchmark (a cooling failure under load at minute 8): for
the eight minutes before it nothing is even raised, and nothing but that fault
pages in the whole run; the fault is paged as one incident and its node
drained. One run instead of a healthy one plus a faulty one: the two are the
same run up to the fault (same seed), so the first eight minutes are the
healthy fleet. The full hour is `python bench/alert_noise.py`
(bench/RESULTS.md).

This is CPU-bound work under a virtual clock (about 10 s on a quiet machine):
its time limit is a hang guard sized for a machine that is busy with other
work, not a speed check (speed is the benchmark's business).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import alert_noise  # noqa: E402

FAULT_AT_S = 8 * 60


@pytest.mark.timeout(1800)
def test_eight_healthy_minutes_raise_nothing_and_a_cooling_failure_then_pages_once(capsys):
    out, plan = alert_noise.run("faults", 10, 1, alert_noise.DEFAULT_RULES_FILE, with_faults=True)
    figures = alert_noise.report(out, plan, 10)
    printed = capsys.readouterr().out
    assert [sc.at_s for sc in plan] == [FAULT_AT_S]
    # The healthy part: not one alert, not even a warning, before the fault.
    assert out.raised_at and min(out.raised_at) >= FAULT_AT_S, printed
    assert out.samples >= 256 * 600 - 10 and len(out.jobs) == 4  # every workload class ran
    # The fault: paged, as one incident, nothing else paged, its node drained.
    assert figures["faults_paged"] == 1 and figures["one_incident_each"] == 1 and figures["false_pages"] == 0, printed
    assert "[ok] cooling failure, one GPU (H100, under load) at 8 min" in printed
    assert [node for _, node, _ in out.drains] == [plan[0].node]
