"""The pure lifecycle core: a job's history folded into its record, and a node's heartbeat reconciled."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from whaleflux.scheduler.attempts import reconcile
from whaleflux.scheduler.history import Fold, fold
from whaleflux.scheduler.records import JobPart, JobRecord
from whaleflux.shared.events import (
    AttemptReport,
    JobFailed,
    JobFinished,
    JobPlaced,
    JobRejected,
    JobRequeued,
    JobStarted,
    JobSubmitted,
    NodeHeartbeat,
    make_envelope,
)

T0 = datetime(2026, 12, 1, 12, tzinfo=UTC)


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def ev(t: float, data):
    return make_envelope(data, source="test", time=at(t)), data


def submitted(job="j1", **kw):
    return JobSubmitted(job_id=job, name=job, command=["true"], **kw)


def placed(job="j1", attempt=1, node="n1", gpus=("g0",), rank=None, gang=None):
    return JobPlaced(job_id=job, attempt=attempt, cluster="c", node=node, gpu_model="H100", gpu_uuids=list(gpus),
                     gpu_indices=list(range(len(gpus))), command=["true"], team="t", project="p", rank=rank,
                     gang_nodes=gang)


def started(job="j1", attempt=1, node="n1", t=1.0, rank=None):
    return JobStarted(job_id=job, attempt=attempt, cluster="c", node=node, gpu_uuids=["g0"], pid=1, started_at=at(t),
                      rank=rank)


def finished(job="j1", attempt=1, node="n1", code=0, t0=1.0, t1=5.0, interrupted=None, rank=None):
    return JobFinished(job_id=job, attempt=attempt, cluster="c", node=node, exit_code=code, started_at=at(t0),
                       finished_at=at(t1), interrupted=interrupted, rank=rank)


def requeued(job="j1", attempt=1, node="n1", cause="node_lost", reason="node lost"):
    return JobRequeued(job_id=job, attempt=attempt, cluster="c", node=node, reason=reason, cause=cause)


def fold_(*events, max_restarts=3):
    return fold(events, hold_s=15.0, max_restarts=max_restarts)


def test_a_finished_job_stays_finished_and_is_never_queued_again():
    jobs = fold_(ev(0, submitted()), ev(0.5, placed()), ev(1, started()), ev(5, finished(code=0)))
    job = jobs["j1"]
    assert job.state == "succeeded" and job.attempt == 1 and job.exit_code == 0 and job.finished_at == at(5)


def test_a_running_attempt_is_readopted_where_it_runs_not_restarted():
    job = fold_(ev(0, submitted()), ev(0.5, placed(node="n2", gpus=("g5", "g6"))), ev(1, started(node="n2")))["j1"]
    got = (job.state, job.attempt, job.node, job.gpu_uuids, job.started_at)
    assert got == ("running", 1, "n2", ["g5", "g6"], at(1))


def test_only_a_never_placed_job_is_pending():
    jobs = fold_(ev(0, submitted("a")), ev(0, submitted("b")), ev(1, placed("b")))
    assert jobs["a"].state == "pending" and jobs["b"].state == "placed"


def test_folding_the_same_history_twice_gives_the_same_records():
    events = [ev(0, submitted()), ev(0.5, placed()), ev(1, started()), ev(3, requeued(cause="preempted", reason="p")),
              ev(4, finished(code=-15)), ev(5, placed(attempt=2, node="n2")), ev(6, started(attempt=2, node="n2"))]
    once = fold_(*events)["j1"]
    twice = fold_(*events, *events)["j1"]
    assert once == twice and once.state == "running" and once.attempt == 2 and once.node == "n2"


def test_a_lost_attempt_holds_the_job_until_its_end_is_reported():
    events = [ev(0, submitted()), ev(0.5, placed()), ev(1, started()), ev(20, requeued(cause="node_lost"))]
    job = fold_(*events)["j1"]
    assert job.state == "pending" and job.held_until == at(35) and job.gpu_uuids == []
    job = fold_(*events, ev(22, finished(code=-15, t1=21, interrupted="stopped by the scheduler: node lost")))["j1"]
    assert job.state == "pending" and job.held_until is None


def test_a_planned_stop_requeues_to_resume_and_a_real_failure_is_final():
    interrupted = fold_(ev(0, submitted()), ev(0.5, placed()), ev(1, started()),
                        ev(5, finished(code=-15, interrupted="agent stopped: planned shutdown")))["j1"]
    assert interrupted.state == "pending" and "interrupted" in interrupted.reason and interrupted.preemptions == 0
    failed = fold_(ev(0, submitted()), ev(0.5, placed()), ev(1, started()), ev(5, finished(code=-15)))["j1"]
    assert failed.state == "failed" and failed.exit_code == -15


def test_restart_on_failure_follows_the_jobs_policy_and_its_limit():
    events = [ev(0, submitted(restart_on_failure=True)), ev(0.5, placed()), ev(1, started()), ev(2, finished(code=1)),
              ev(2.1, requeued(cause="restart_on_failure", reason="failed (exit code 1), restarting"))]
    job = fold_(*events)["j1"]
    assert job.state == "pending" and len(job.requeues) == 1
    assert fold_(*events[:4], max_restarts=0)["j1"].state == "failed"


def test_a_rejected_job_stays_rejected_and_events_of_unknown_jobs_change_nothing():
    jobs = fold_(ev(0, submitted()), ev(1, JobRejected(job_id="j1", reason="too big")), ev(2, finished("ghost")))
    assert jobs["j1"].state == "rejected" and "ghost" not in jobs


def test_a_failed_start_is_final():
    fail = JobFailed(job_id="j1", attempt=1, cluster="c", node="n1", reason="cannot start command: nope",
                     failed_at=at(1))
    job = fold_(ev(0, submitted()), ev(0.5, placed()), ev(1, fail))["j1"]
    assert job.state == "failed" and "cannot start" in job.reason


def test_a_gang_is_folded_part_by_part_and_succeeds_when_every_part_did():
    gang = ["n1", "n2"]
    events = [ev(0, submitted(gpus=16)), ev(0.5, placed(node="n1", gpus=("a",), rank=0, gang=gang)),
              ev(0.5, placed(node="n2", gpus=("b",), rank=1, gang=gang)),
              ev(1, started(node="n1", rank=0)), ev(1, started(node="n2", rank=1))]
    running = fold_(*events)["j1"]
    assert running.state == "running" and [p.node for p in running.parts] == gang and running.gpu_uuids == ["a", "b"]
    done = fold_(*events, ev(5, finished(node="n1", rank=0)), ev(5, finished(node="n2", rank=1)))["j1"]
    assert done.state == "succeeded"


# ----------------------------------------------------------------------------- reconcile


def record(job="j1", attempt=1, node="n1", state="running", started=1.0, placed_at=0.5, parts=()):
    return JobRecord(job_id=job, spec=submitted(job), submitted_at=at(0), state=state, attempt=attempt, cluster="c",
                     node=node, gpu_uuids=["g0"], started_at=at(started) if started is not None else None,
                     placed_at=at(placed_at), parts=list(parts))


def heartbeat(*attempts):
    return NodeHeartbeat(cluster="c", node="n1", seq=1, attempts=list(attempts))


def running(job="j1", attempt=1, rank=None):
    return AttemptReport(job_id=job, attempt=attempt, rank=rank, state="running", started_at=at(1))


def exited(job="j1", attempt=1, code=7, t1=9.0, interrupted=None):
    return AttemptReport(job_id=job, attempt=attempt, state="exited", started_at=at(1), exit_code=code,
                         finished_at=at(t1), interrupted=interrupted)


def test_an_attempt_the_node_recorded_as_ended_is_ended_with_its_real_exit_and_time():
    plan = reconcile(heartbeat(exited(code=7, t1=9)), at(20), [record()], {}, at(20), 30)
    assert [(f.job_id, f.exit_code, f.finished_at) for f in plan.ended] == [("j1", 7, at(9))]
    assert not plan.lost and not plan.stop


def test_an_attempt_the_node_no_longer_lists_is_lost():
    plan = reconcile(heartbeat(), at(20), [record()], {}, at(20), 30)
    assert [j.job_id for j, _ in plan.lost] == ["j1"] and not plan.ended


def test_a_heartbeat_sent_right_after_the_start_is_not_taken_for_a_loss():
    assert not reconcile(heartbeat(), at(1.5), [record()], {}, at(1.5), 30).lost


def test_a_placement_without_a_start_by_gets_time_to_reach_the_node_then_is_given_up_on_unconfirmed():
    placed_only = record(state="placed", started=None, placed_at=0)
    assert not reconcile(heartbeat(), at(10), [placed_only], {}, at(10), 30).unstarted
    [(job, verdict)] = reconcile(heartbeat(), at(31), [placed_only], {}, at(31), 30).unstarted
    assert job.job_id == "j1" and not verdict.confirmed  # its node may start it still: stopped and held


def test_an_attempt_the_node_runs_that_it_should_not_is_stopped():
    moved = record(attempt=2, node="n2")  # the job runs its second attempt elsewhere
    ended = record("j2", state="succeeded")
    plan = reconcile(heartbeat(running("j1", 1), running("j2", 1), running("j3", 1)), at(20), [],
                     {"j1": moved, "j2": ended}, at(20), 30)
    assert sorted(a.job_id for a in plan.stop) == ["j1", "j2"]  # j3: unknown here, not ours to judge
    # An attempt newer than the record we read (our view lags) and one already being stopped are left alone.
    lagging = record(attempt=1, node="n2")
    stopping = record("j4", state="pending", attempt=1)
    plan = reconcile(heartbeat(running("j1", 2), running("j4", 1)), at(20), [], {"j1": lagging, "j4": stopping},
                     at(20), 30)
    assert plan.stop == []


def test_the_current_attempt_running_where_we_placed_it_changes_nothing():
    plan = reconcile(heartbeat(running()), at(20), [record()], {}, at(20), 30)
    assert not plan.ended and not plan.lost and not plan.stop


def test_a_gang_part_is_matched_by_its_rank():
    parts = [JobPart(rank=r, cluster="c", node=f"n{r}", gpu_model="H100", gpu_uuids=[g], gpu_indices=[0],
                     state="running", started_at=at(1)) for r, g in ((0, "a"), (1, "b"))]
    gang = record(node="n0", parts=parts)
    assert not reconcile(heartbeat(running(rank=1)), at(20), [gang], {}, at(20), 30).lost
    assert reconcile(heartbeat(running(rank=0)), at(20), [gang], {}, at(20), 30).lost


def test_a_snapshot_plus_the_tail_folds_to_the_same_records_as_the_whole_history():
    head = [ev(0, submitted("a")), ev(0.5, placed("a")), ev(1, started("a")),
            ev(0, submitted("b")), ev(0.5, placed("b", node="n2")), ev(1, started("b", node="n2")),
            ev(3, requeued("b", node="n2", cause="preempted", reason="p"))]
    tail = [ev(4, finished("b", node="n2", code=-15)), ev(5, finished("a")), ev(6, submitted("c"))]
    whole = fold_(*head, *tail)
    first = Fold(15.0, 3)
    for e in head:
        first.apply(*e)
    resumed, seq = Fold.load(first.dump(seq=len(head)), 15.0, 3)
    assert seq == len(head)
    for e in tail:
        resumed.apply(*e)
    assert resumed.jobs == whole
    assert whole["b"].held_until is None, "the end reported after the snapshot still releases the hold"


def test_a_snapshot_keeps_live_jobs_and_recent_history_only():
    f = Fold(15.0, 3)
    for e in [ev(0, submitted("old")), ev(0.5, placed("old")), ev(1, started("old")), ev(2, finished("old", t1=2)),
              ev(0, submitted("recent")), ev(0.5, placed("recent")), ev(1, started("recent")),
              ev(9, finished("recent", t1=9)), ev(0, submitted("waiting")), ev(0, submitted("running")),
              ev(0.5, placed("running")), ev(1, started("running"))]:
        f.apply(*e)
    assert f.forget_finished(before=at(5)) == 1
    assert sorted(f.jobs) == ["recent", "running", "waiting"]


def test_a_lost_attempt_that_reports_its_own_end_after_all_ends_the_job_instead_of_running_it_again():
    events = [ev(0, submitted()), ev(0.5, placed()), ev(1, started()), ev(20, requeued(cause="node_lost")),
              ev(24, finished(code=0, t1=19))]
    job = fold_(*events)["j1"]
    assert job.state == "succeeded" and job.finished_at == at(19) and job.lost_attempt is None
    # A stop it was told to make, or one it made itself, keeps it queued to resume.
    fenced = fold_(*events[:4], ev(24, finished(code=-15, interrupted="agent silent for 10 s")))["j1"]
    assert fenced.state == "pending" and fenced.held_until is None
    preempted = fold_(*events[:3], ev(20, requeued(cause="preempted", reason="p")), ev(24, finished(code=0)))["j1"]
    assert preempted.state == "pending", "a preempted job that saves and exits 0 on SIGTERM is not done"


def test_a_heartbeat_sent_before_the_recorded_end_does_not_stop_the_ended_attempt():
    parts = [JobPart(rank=0, cluster="c", node="n0", gpu_model="H100", gpu_uuids=["a"], gpu_indices=[0],
                     state="running", started_at=at(1)),
             JobPart(rank=1, cluster="c", node="n1", gpu_model="H100", gpu_uuids=["b"], gpu_indices=[0],
                     state="exited", started_at=at(1), finished_at=at(9))]
    gang = record(node="n0", parts=parts)  # rank 1 exited at 9 (its report); rank 0 still runs
    part_done = NodeHeartbeat(cluster="c", node="n1", seq=1, attempts=[running(rank=1)])
    assert reconcile(part_done, at(8.5), [], {"j1": gang}, at(20), 30).stop == []
    assert [a.rank for a in reconcile(part_done, at(20), [], {"j1": gang}, at(20), 30).stop] == [1]
    done = record(state="succeeded")
    done.finished_at = at(9)
    assert reconcile(heartbeat(running()), at(9.5), [], {"j1": done}, at(20), 30).stop == []
    assert [a.job_id for a in reconcile(heartbeat(running()), at(20), [], {"j1": done}, at(20), 30).stop] == ["j1"]


def test_the_other_part_of_a_failed_gang_gets_its_stop_order_s_grace_before_another():
    parts = [JobPart(rank=0, cluster="c", node="n1", gpu_model="H100", gpu_uuids=["a"], gpu_indices=[0],
                     state="running", started_at=at(1)),
             JobPart(rank=1, cluster="c", node="n2", gpu_model="H100", gpu_uuids=["b"], gpu_indices=[0],
                     state="exited", started_at=at(1), finished_at=at(9), exit_code=3)]
    failed = record(state="failed", parts=parts)  # rank 1 failed at 9; rank 0 was told to stop then
    failed.finished_at = at(9)
    hb = heartbeat(running(rank=0))
    assert reconcile(hb, at(12), [], {"j1": failed}, at(12), 30, stopping_s=12).stop == []
    assert [a.rank for a in reconcile(hb, at(22), [], {"j1": failed}, at(22), 30, stopping_s=12).stop] == [0]


# ----------------------------------------------------------------------------- reports from other nodes


def test_a_report_from_another_node_than_the_attempts_changes_nothing():
    from whaleflux.scheduler.history import from_attempt_node

    job = record(node="n1")
    assert from_attempt_node(job, finished(node="n1")) and not from_attempt_node(job, finished(node="n2"))
    assert not from_attempt_node(job, finished(node="n1").model_copy(update={"cluster": "other"}))
    assert from_attempt_node(job, finished(attempt=2, node="n2")), "another attempt's report: the other guards'"
    gang = record(parts=[JobPart(rank=r, cluster="c", node=n, gpu_model="H100", gpu_uuids=[n], gpu_indices=[0])
                         for r, n in enumerate(("n1", "n2"))])
    assert from_attempt_node(gang, finished(node="n2", rank=1)) and not from_attempt_node(gang, finished(node="n3"))
    # Folded: a forged end neither ends the running attempt nor releases the hold of a stopped one.
    events = [ev(0, submitted()), ev(0.5, placed(node="n1")), ev(1, started(node="n1"))]
    assert fold_(*events, ev(2, finished(node="n2", code=0)))["j1"].state == "running"
    assert fold_(ev(0, submitted()), ev(0.5, placed(node="n1")), ev(1, started(node="n2")))["j1"].state == "placed"
    lost = [*events, ev(20, requeued(cause="node_lost"))]
    held = fold_(*lost, ev(22, finished(node="n2", code=0, t1=21)))["j1"]
    assert held.state == "pending" and held.held_until == at(35)
    assert fold_(*lost, ev(22, finished(node="n1", code=0, t1=21)))["j1"].state == "succeeded"
