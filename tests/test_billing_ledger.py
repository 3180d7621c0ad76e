"""Billing's ledger and energy decisions, pure: what a job event changes, what a telemetry batch adds."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from whaleflux.billing.ledger import JobEventState, Span, interval_after, job_event, record_for, spans
from whaleflux.billing.metering import UsageRecord
from whaleflux.shared.contracts import JobHolds
from whaleflux.shared.events import JobFailed, JobFinished, JobPlaced, JobRequeued, JobStarted

T0 = datetime(2026, 3, 10, 8, tzinfo=UTC)
PLACED = JobPlaced(job_id="j", attempt=2, cluster="c1", node="n1", gpu_model="H100", gpu_uuids=["G0", "G1"],
                   gpu_indices=[0, 1], command=["x"], team="nlp", project="bot")


def _running(start: datetime = T0) -> UsageRecord:
    span = Span("j", 2, 0, "running", start, None)
    return record_for(span, PLACED, start, None)


def test_start_finish_and_failure_before_start_become_spans_of_the_attempt():
    started = JobStarted(job_id="j", attempt=2, cluster="c1", node="n1", gpu_uuids=["G0"], pid=1, started_at=T0)
    finished = JobFinished(job_id="j", attempt=2, cluster="c1", node="n1", exit_code=0, started_at=T0,
                           finished_at=T0 + timedelta(hours=1))
    never_ran = JobFailed(job_id="j", attempt=2, cluster="c1", node="n1", reason="image", started_at=None,
                          failed_at=T0)
    assert spans(started, T0) == [Span("j", 2, 0, "running", T0, None)]
    assert spans(finished, T0) == [Span("j", 2, 0, "finished", T0, T0 + timedelta(hours=1))]
    assert spans(never_ran, T0) == []  # nothing ran: nothing to charge
    assert spans(PLACED, T0) == []


def test_a_requeued_gang_ends_every_part_still_running_at_the_requeue():
    requeued = JobRequeued(job_id="j", attempt=2, cluster="c1", node="n1", reason="lost", cause="node_lost",
                           gang_nodes=["n1", "n2", "n3"])
    at = T0 + timedelta(hours=2)
    parts = spans(requeued, at)
    assert [(s.rank, s.state, s.started, s.end) for s in parts] == [(r, "requeued", None, at) for r in range(3)]
    assert [s.ledger for s in parts] == ["j:2", "j:2#r1", "j:2#r2"]
    # A running part ends at the requeue; an ended one, or one never started, stays as it is.
    assert interval_after(parts[0], _running()) == (T0, at)
    assert interval_after(parts[0], None) is None
    done = record_for(Span("j", 2, 0, "finished", T0, T0 + timedelta(hours=1)), PLACED, T0, T0 + timedelta(hours=1))
    assert interval_after(parts[0], done) is None
    # A requeue stamped before the recorded start never makes a negative interval.
    late_start = _running(at + timedelta(minutes=5))
    assert interval_after(parts[0], late_start) == (late_start.started_at, late_start.started_at)


def test_a_start_replayed_after_the_end_leaves_the_ended_record_and_a_late_end_replaces_a_requeue():
    end = T0 + timedelta(hours=3)
    finished = record_for(Span("j", 2, 0, "finished", T0, end), PLACED, T0, end)
    assert finished.state == "finished" and finished.gpu_seconds == 2 * 3 * 3600 and finished.gpus == 2
    replayed_start = Span("j", 2, 0, "running", T0, None)
    assert interval_after(replayed_start, finished) is None
    requeued = record_for(Span("j", 2, 0, "requeued", T0, T0 + timedelta(hours=2)), PLACED, T0, T0 + timedelta(hours=2))
    late_end = Span("j", 2, 0, "finished", T0, end)
    assert interval_after(late_end, requeued) == (T0, end)
    record = record_for(late_end, PLACED, T0, end)
    assert (record.team, record.project, record.gpu_uuids, record.ended_at) == ("nlp", "bot", ["G0", "G1"], end)


def test_a_job_event_holds_gpus_and_records_usage_together_and_waits_for_its_placement():
    started = JobStarted(job_id="j", attempt=2, cluster="c1", node="n1", gpu_uuids=["G0", "G1"], pid=1, started_at=T0)
    early = job_event(started, T0, JobEventState(JobHolds(), {"G0": None, "G1": None}))
    assert early.missing == "no placement recorded for job j attempt 2" and early.records == ()

    placed = job_event(PLACED, T0, JobEventState(JobHolds(), {"G0": None, "G1": None}))
    assert placed.placement == ("j:2", PLACED) and placed.records == ()
    assert {g: (h.attempt_key, h.started_at) for g, h in placed.holders.hold.items()} == {
        "G0": ("j:2", None), "G1": ("j:2", None)}

    state = JobEventState(placed.holders.job, placed.holders.hold, {"j:2": None}, {"j:2": PLACED})
    running = job_event(started, T0, state)
    [record] = running.records
    assert running.missing is None and record.state == "running" and record.ended_at is None
    assert {h.started_at for h in running.holders.hold.values()} == {T0}  # charged from its start on


def test_an_older_attempts_late_start_is_metered_but_never_takes_the_gpus_of_a_newer_attempt():
    newer = PLACED.model_copy(update={"attempt": 3})
    after = job_event(newer, T0, JobEventState(JobHolds(), {"G0": None, "G1": None}))
    holders = after.holders.hold
    old_start = JobStarted(job_id="j", attempt=2, cluster="c1", node="n1", gpu_uuids=["G0", "G1"], pid=1,
                           started_at=T0 - timedelta(hours=1))
    late = job_event(old_start, T0, JobEventState(after.holders.job, holders, {"j:2": None}, {"j:2": PLACED}))
    assert not late.holders.changed and late.holders.job == after.holders.job
    [record] = late.records
    assert record.key == "j:2" and record.started_at == T0 - timedelta(hours=1)


def test_a_batch_is_decided_in_stream_order_and_a_start_before_its_placement_waits_alone():
    from whaleflux.billing.ledger import LedgerView, job_events, reads_for

    started = JobStarted(job_id="j", attempt=2, cluster="c1", node="n1", gpu_uuids=["G0", "G1"], pid=1, started_at=T0)
    finished = JobFinished(job_id="j", attempt=2, cluster="c1", node="n1", exit_code=0, started_at=T0,
                           finished_at=T0 + timedelta(hours=1))
    early = JobStarted(job_id="k", attempt=1, cluster="c1", node="n1", gpu_uuids=["G5"], pid=1, started_at=T0)
    batch = [(PLACED, T0), (started, T0), (early, T0), (finished, T0 + timedelta(hours=1))]
    jobs, gpus, ledgers = reads_for(batch)
    assert (jobs, gpus, ledgers) == (["j", "k"], ["G0", "G1", "G5"], ["j:2", "k:1"])
    view = LedgerView(usage=dict.fromkeys(ledgers), placements=dict.fromkeys(ledgers),
                      holders=dict.fromkeys(gpus))
    outcomes = job_events(batch, view)
    assert [o if o is None else (type(o).__name__, str(o)) for o in outcomes] == [
        None, None, ("Retry", "no placement recorded for job k attempt 1"), None]
    record = view.usage["j:2"]
    assert record is not None and record.state == "finished" and record.ended_at == T0 + timedelta(hours=1)
    assert view.placements["j:2"] == PLACED and view.usage["k:1"] is None
    assert view.dirty_usage == {"j:2"} and view.dirty_placements == {"j:2"} and view.dirty_holds == {"j"}
    assert view.holders["G0"] is None and {"G0", "G1"} <= view.dirty_holders  # held, then released at the end

    # The same batch again (a redelivery) on what was written: the same record.
    again = LedgerView(holds=dict(view.holds), holders=dict(view.holders), usage=dict(view.usage),
                       placements=dict(view.placements))
    job_events(batch, again)
    assert again.usage["j:2"] == record


def test_a_report_from_another_node_than_its_placement_changes_nothing_and_is_refused():
    from whaleflux.billing.ledger import LedgerView, job_events

    forged = JobFinished(job_id="j", attempt=2, cluster="c1", node="n9", exit_code=0, started_at=T0,
                         finished_at=T0 + timedelta(hours=1))
    holds = job_event(PLACED, T0, JobEventState(JobHolds(), {"G0": None, "G1": None})).holders
    state = JobEventState(holds.job, holds.hold, {"j:2": _running()}, {"j:2": PLACED})
    out = job_event(forged, T0, state)
    assert out.refused == "job.finished from c1/n9 for job j attempt 2, placed on c1/n1"
    assert out.records == () and not out.holders.changed and out.holders.job == holds.job
    own = job_event(forged.model_copy(update={"node": "n1"}), T0, state)
    assert own.refused is None and own.records[0].state == "finished" and own.holders.release
    # A failure that never started has no span, but would release the GPUs: refused all the same.
    never_ran = JobFailed(job_id="j", attempt=2, cluster="c1", node="n9", reason="x", failed_at=T0)
    view = LedgerView(holds={"j": holds.job}, holders=dict(holds.hold), usage={"j:2": _running()},
                      placements={"j:2": PLACED})
    [refused] = job_events([(never_ran, T0)], view)
    assert type(refused).__name__ == "Reject" and "placed on c1/n1" in str(refused)
    assert not view.dirty_holders and not view.dirty_holds
