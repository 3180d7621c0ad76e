"""Job failures raise alerts routed to the job's team (issue 16, deliver 6): non-zero exits, signals, out of
memory, commands that could not start; a clean exit or a planned stop raises nothing. No servers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from whaleflux.alerting.config import DEFAULT_RULES_FILE, load_config
from whaleflux.alerting.dispatch.route import build_route
from whaleflux.alerting.firing import FiringAlerts
from whaleflux.alerting.rules.engine import RuleEngine
from whaleflux.alerting.rules.jobs import failure_fields
from whaleflux.shared.catalog import gpu_models
from whaleflux.shared.events import AlertRaised, JobFailed, JobFinished

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def finished(code: int, attempt: int = 1, **kw) -> JobFinished:
    return JobFinished(job_id="j1", attempt=attempt, cluster="c", node="n1", exit_code=code, started_at=T0,
                       finished_at=T0 + timedelta(minutes=5), **kw)


def test_what_counts_as_a_failure_and_how_it_reads():
    owner = ("search", "rank")
    assert failure_fields("job.finished", finished(0).model_dump(mode="json"), owner) is None
    assert failure_fields("job.finished", finished(143, interrupted="agent stopping").model_dump(mode="json"),
                          owner) is None
    plain = failure_fields("job.finished", finished(3).model_dump(mode="json"), owner)
    assert plain is not None and (plain["cause"], plain["outcome"], plain["team"]) == ("exit", "exited with code 3",
                                                                                         "search")
    killed = failure_fields("job.finished", finished(-9).model_dump(mode="json"), owner)
    assert killed is not None and killed["cause"] == "signal" and killed["signal"] == "SIGKILL"
    shell = failure_fields("job.finished", finished(139).model_dump(mode="json"), None)
    assert shell is not None and shell["outcome"] == "was killed by SIGSEGV (exit code 139)" and shell["team"] == (
        "unknown")
    logged = {**finished(1).model_dump(mode="json"),
              "log_tail": [f"step {i}" for i in range(30)] + ["torch.OutOfMemoryError: CUDA out of memory."]}
    oom = failure_fields("job.finished", logged, owner)
    assert oom is not None and oom["cause"] == "oom" and oom["log_tail"].count("\n") == 9  # the last 10 lines
    assert oom["log_tail"].endswith("CUDA out of memory.")
    failed = JobFailed(job_id="j1", attempt=1, cluster="c", node="n1", reason="command not found: trian.py",
                       failed_at=T0)
    start = failure_fields("job.failed", failed.model_dump(mode="json"), owner)
    assert start is not None and start["cause"] == "start" and start["outcome"].endswith("trian.py")


def test_the_shipped_rules_raise_a_failure_alert_for_the_jobs_team_and_route_it_by_team():
    cfg = load_config(DEFAULT_RULES_FILE)
    engine = RuleEngine(cfg, gpu_models())
    engine.observe_job("j1", "llm-train", ("search", "rank"))
    assert engine.observe_event("job.finished", finished(0), T0) == []
    [tr] = engine.observe_event("job.finished", finished(-9), T0)
    assert tr.rule.name == "JobExitedWithError"
    assert tr.summary == "job j1 attempt 1 on n1 was killed by SIGKILL (exit code -9)"
    assert tr.labels == {"job_id": "j1", "attempt": "1", "team": "search", "project": "rank", "cause": "signal",
                         "exit_code": "-9", "signal": "SIGKILL"}
    assert engine.observe_event("job.finished", finished(-9), T0) == []  # the same attempt: one alert
    [again] = engine.observe_event("job.finished", finished(2, attempt=2), T0)  # a retry fails too: still the team's
    assert again.labels["team"] == "search" and again.labels["exit_code"] == "2"
    change = FiringAlerts("whaleflux/alerting/test").change(tr, T0)
    assert change is not None and isinstance(change.alert, AlertRaised) and change.alert.category == "job"
    labels = {"alertname": tr.rule.name, "category": "job", "severity": "warning", **tr.labels}
    [route] = build_route(cfg.route).match(labels)
    assert route.group_by == ("team",)


def test_a_failure_alert_carries_its_reason_as_an_annotation():
    engine = RuleEngine(load_config(DEFAULT_RULES_FILE), gpu_models())
    failed = JobFailed(job_id="j2", attempt=1, cluster="c", node="n1", reason="out of memory", exit_code=137,
                       failed_at=T0)
    [tr] = engine.observe_event("job.failed", failed, T0)
    assert tr.labels["cause"] == "oom" and tr.labels["team"] == "unknown"
    assert tr.annotations == {"reason": "out of memory"}
