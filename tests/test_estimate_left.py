"""A preempted job that resumes from its checkpoint is queued again with the estimate its stopped attempt left of
it, in the live record, its job.requeued and a rebuild from the bus; a move or a job that starts over keeps its
whole estimate."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from whaleflux.scheduler.history import fold
from whaleflux.scheduler.records import JobRecord
from whaleflux.scheduler.schedule_request import pending_job, running_job
from whaleflux.scheduler.transitions import requeue
from whaleflux.shared.events import JobPlaced, JobRequeued, JobSubmitted, make_envelope

T0 = datetime(2026, 12, 1, 12, tzinfo=UTC)
HOUR = 3600.0


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def spec(resume: str = "checkpoint") -> JobSubmitted:
    return JobSubmitted(job_id="j1", name="j1", command=["true"], expected_runtime_s=HOUR, resume=resume)


def running(spec_: JobSubmitted, placed_s: float, end_s: float, attempt: int = 1) -> JobRecord:
    """The job's record placed at `placed_s` on a GPU twice as fast as the reference (`end_s`: its expected end)."""
    return JobRecord(job_id="j1", spec=spec_, state="running", attempt=attempt, cluster="c", node="n1",
                     gpu_uuids=["g0"], submitted_at=T0, placed_at=at(placed_s), started_at=at(placed_s),
                     expected_end=at(end_s).timestamp())


def test_a_preempted_job_is_queued_again_with_what_its_attempt_left_of_its_estimate():
    job = running(spec(), 0.0, HOUR / 2)  # one hour of reference work in half an hour
    back = requeue(job, "preempted", "for a shorter job", None, moved=False, now=at(HOUR / 4))
    assert job.estimate_left_s == pytest.approx(HOUR / 2)  # half the attempt ran: half the work is left
    assert isinstance(back.event.data, JobRequeued) and back.event.data.estimate_left_s == pytest.approx(HOUR / 2)
    assert pending_job(job, 1).request.expected_runtime_s == pytest.approx(HOUR / 2)
    # Placed again and preempted again a quarter into its (now half-hour) attempt: the rest shrinks again.
    again = running(spec(), 1000.0, 1000.0 + HOUR / 4, attempt=2)
    again.estimate_left_s, again.preemptions = job.estimate_left_s, job.preemptions
    assert running_job(again).expected_end == pytest.approx(at(1000.0 + HOUR / 4).timestamp())
    requeue(again, "preempted", "for a shorter job", None, moved=False, now=at(1000.0 + HOUR / 16))
    assert again.estimate_left_s == pytest.approx(HOUR / 2 * 0.75)
    assert pending_job(again, 1).request.expected_runtime_s == pytest.approx(HOUR * 0.375)
    assert again.preemptions == 2


@pytest.mark.parametrize(("resume", "moved", "cause"), [
    ("restart", False, "preempted"),   # it starts over: all of its work is left
    ("checkpoint", True, "preempted"),  # a move: the policy moves jobs by their remaining time on the speed table
    ("checkpoint", False, "node_lost"),  # its last checkpoint may be older than the attempt's progress
])
def test_the_whole_estimate_stays_where_the_work_done_is_not_known_to_be_kept(resume, moved, cause):
    job = running(spec(resume), 0.0, HOUR / 2)
    back = requeue(job, cause, "stopped", None, moved=moved, now=at(HOUR / 4))
    assert isinstance(back.event.data, JobRequeued)
    assert job.estimate_left_s is None and back.event.data.estimate_left_s is None
    assert pending_job(job, 1).request.expected_runtime_s == HOUR


def test_a_rebuild_from_the_bus_keeps_the_estimate_a_preemption_left():
    job = running(spec(), 0.0, HOUR / 2)
    back = requeue(job, "preempted", "for a shorter job", None, moved=False, now=at(HOUR / 4))
    placed = JobPlaced(job_id="j1", attempt=1, cluster="c", node="n1", gpu_model="H100", gpu_uuids=["g0"],
                       gpu_indices=[0], command=["true"], team="t", project="p")
    history = [(make_envelope(d, source="test", time=at(t)), d) for t, d in
               ((0.0, spec()), (0.0, placed), (HOUR / 4, back.event.data))]
    rebuilt = fold(history, hold_s=15.0, max_restarts=3)["j1"]
    assert rebuilt.state == "pending" and rebuilt.preemptions == 1
    assert pending_job(rebuilt, 1).request.expected_runtime_s == pytest.approx(HOUR / 2)
