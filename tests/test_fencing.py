"""The fencing rules, pure: a node never starts a placement after its start-by, the scheduler requeues an attempt
that never started only once its node confirmed it will not start it, and a lost node's jobs are held at least as
long as its supervisors take to fence themselves (issue 36, part 4)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from pydantic import ValidationError

from whaleflux.agent.app import AgentSettings
from whaleflux.agent.fencing import refusal
from whaleflux.scheduler.attempts import reconcile
from whaleflux.scheduler.fencing import lost_hold, unstarted
from whaleflux.scheduler.placement import Placement
from whaleflux.scheduler.records import JobPart
from whaleflux.scheduler.settings import SchedulerSettings
from whaleflux.scheduler.transitions import place
from whaleflux.shared.events import AttemptReport, JobPlaced

from .test_job_history import at, heartbeat, placed, record, running


def _placed(start_by: float | None) -> JobPlaced:
    return placed().model_copy(update={"start_by": at(start_by) if start_by is not None else None})


def _unstarted(start_by: float | None = 30.0, parts=()):
    job = record(state="placed", started=None, placed_at=0, parts=parts)
    job.start_by = at(start_by) if start_by is not None else None
    return job


# ----------------------------------------------------------------------------- the node's check


def test_a_placement_is_started_up_to_its_start_by_and_refused_after_it():
    assert refusal(_placed(30), at(29.9)) is None
    assert refusal(_placed(30), at(30)) is None
    why = refusal(_placed(30), at(45))
    assert why is not None and "15.0 s after its start-by" in why and "attempt 1" in why


def test_a_placement_without_a_start_by_is_never_refused():
    assert refusal(_placed(None), at(10_000)) is None


# ----------------------------------------------------------------------------- the scheduler's requeue rule


def test_an_attempt_never_started_waits_while_the_nodes_clock_is_not_past_its_start_by():
    job = _unstarted(start_by=30)
    # Our clock is long past the start-by, but the node's (the heartbeat's time) is not: it may start it still.
    assert unstarted(job, "n1", sent_at=at(29), now=at(300), window_s=30) is None
    assert not reconcile(heartbeat(), at(29), [job], {}, at(300), 30).unstarted


def test_an_attempt_never_started_is_requeued_at_once_on_a_heartbeat_past_its_start_by_that_omits_it():
    job = _unstarted(start_by=30)
    verdict = unstarted(job, "n1", sent_at=at(31), now=at(31), window_s=30)
    assert verdict is not None and verdict.confirmed and "will not" in verdict.why
    [(lost, got)] = reconcile(heartbeat(), at(31), [job], {}, at(31), 30).unstarted
    assert lost is job and got.confirmed


def test_a_heartbeat_past_the_start_by_that_lists_the_attempt_as_starting_keeps_it():
    job = _unstarted(start_by=30)
    starting = AttemptReport(job_id="j1", attempt=1, state="running")  # checked before start_by, not started yet
    plan = reconcile(heartbeat(starting), at(40), [job], {}, at(40), 30)
    assert not plan.unstarted and not plan.lost and not plan.stop


def test_an_attempt_the_node_lists_as_refused_is_requeued_at_once_with_its_reason():
    job = _unstarted(start_by=30)
    refused = AttemptReport(job_id="j1", attempt=1, state="refused", finished_at=at(31), interrupted="too late")
    [(_, verdict)] = reconcile(heartbeat(refused), at(31), [job], {}, at(31), 30).unstarted
    assert verdict.confirmed and "refused attempt 1: too late" in verdict.why


def test_a_refused_older_attempt_is_neither_stopped_nor_requeued_again():
    moved = record(attempt=2, node="n2")
    refused = AttemptReport(job_id="j1", attempt=1, state="refused", finished_at=at(31))
    plan = reconcile(heartbeat(refused), at(40), [], {"j1": moved}, at(40), 30)
    assert not plan.unstarted and not plan.lost and not plan.stop


def test_a_gang_part_not_started_is_judged_by_the_attempts_start_by():
    parts = [JobPart(rank=r, cluster="c", node="n1" if r == 0 else "n2", gpu_model="H100", gpu_uuids=[g],
                     gpu_indices=[0]) for r, g in ((0, "a"), (1, "b"))]
    job = _unstarted(start_by=30, parts=parts)
    assert not reconcile(heartbeat(running(rank=1)), at(29), [job], {}, at(29), 30).unstarted
    [(_, verdict)] = reconcile(heartbeat(), at(31), [job], {}, at(31), 30).unstarted
    assert verdict.confirmed


# ----------------------------------------------------------------------------- holds


def test_a_lost_nodes_started_job_is_held_for_the_fence_budget_from_now():
    job = record()  # started at 1
    job.start_by = at(30)
    assert lost_hold(job, at(10), 65) == at(75)


def test_a_lost_nodes_job_not_started_yet_is_held_from_its_start_by_the_latest_its_node_may_start_it():
    assert lost_hold(_unstarted(start_by=30), at(10), 65) == at(95)
    assert lost_hold(_unstarted(start_by=None), at(10), 65) == at(75)  # no token: as before
    assert lost_hold(_unstarted(start_by=5), at(10), 65) == at(75)  # past already: from now


def test_the_schedulers_hold_outlasts_the_self_fence_budget_and_its_grace():
    defaults = SchedulerSettings()
    assert defaults.fence_after_s >= 60
    assert defaults.hold_s >= defaults.fence_after_s + defaults.preemption_grace_s
    assert AgentSettings(admin_token="x" * 24, nats_password="x" * 24).fence_after_s == defaults.fence_after_s
    tuned = SchedulerSettings(fence_after_s=120, heartbeat_lost_s=10, preemption_grace_s=5)
    assert tuned.hold_s == 125 and tuned.stop_hold(at(0)) == at(125)
    fast = SchedulerSettings(fence_after_s=1, heartbeat_suspect_s=1, heartbeat_lost_s=2.5, preemption_grace_s=2)
    assert fast.hold_s == 4.5  # a node is declared lost after its supervisors fenced: that is the longer wait


def test_a_fence_budget_shorter_than_two_heartbeats_is_refused_at_start():
    with pytest.raises(ValidationError, match="FENCE_AFTER_S"):
        AgentSettings(admin_token="x" * 24, nats_password="x" * 24, fence_after_s=1.5, interval_s=1)


# ----------------------------------------------------------------------------- the token on the wire


def test_each_placement_carries_a_start_by_window_s_after_it_was_made():
    job = record(state="pending", started=None, placed_at=0)
    p = Placement(node="n1", cluster="c", model="H100", gpu_uuids=("g0",), gpu_indices=(0,))
    [announcement] = place(job, p, at(100), None, start_within_s=30)
    assert isinstance(announcement.data, JobPlaced) and announcement.data.start_by == at(130)
    assert job.start_by == at(130) and job.placed_at == at(100)
    [legacy] = place(job, p, at(200), None)
    assert isinstance(legacy.data, JobPlaced) and legacy.data.start_by is None and job.start_by is None


def test_start_by_is_optional_on_the_wire_and_kept_through_a_round_trip():
    assert JobPlaced.model_validate(placed().model_dump(mode="json")).start_by is None
    again = JobPlaced.model_validate(_placed(30).model_dump(mode="json"))
    assert again.start_by == at(30) and again.start_by - at(0) == timedelta(seconds=30)


def test_a_rebuild_from_history_keeps_the_placements_start_by():
    from .test_job_history import ev, fold_, submitted

    job = fold_(ev(0, submitted()), ev(0.5, _placed(30)))["j1"]
    assert job.state == "placed" and job.start_by == at(30)


def test_a_refusal_from_the_node_it_was_placed_on_ends_the_hold_of_a_job_requeued_meanwhile():
    held = record(state="pending", started=None, placed_at=0)
    held.held_until = at(95)
    refused = AttemptReport(job_id="j1", attempt=1, state="refused", finished_at=at(40))
    assert [j.job_id for j in reconcile(heartbeat(refused), at(40), [], {"j1": held}, at(40), 30).released] == ["j1"]
    elsewhere = held.model_copy(update={"node": "n2"})
    placed_again = held.model_copy(update={"attempt": 2})
    part = refused.model_copy(update={"rank": 1})  # a gang's part: its other parts may still run
    assert not reconcile(heartbeat(refused), at(40), [], {"j1": elsewhere}, at(40), 30).released
    assert not reconcile(heartbeat(refused), at(40), [], {"j1": placed_again}, at(40), 30).released
    assert not reconcile(heartbeat(part), at(40), [], {"j1": held}, at(40), 30).released


def test_a_node_announcing_a_longer_self_fence_budget_has_its_lost_jobs_held_for_it():
    from whaleflux.scheduler.fencing import node_hold_s
    from whaleflux.shared.events import NodeRegistered

    def reg(fence_after_s=None, stop_grace_s=None):
        return NodeRegistered(cluster="c", node="n1", agent_version="t", gpus=[], fence_after_s=fence_after_s,
                              stop_grace_s=stop_grace_s)

    assert node_hold_s(65, 10, None) == 65 and node_hold_s(65, 10, reg()) == 65  # an older agent: the settings'
    assert node_hold_s(65, 10, reg(60, 5)) == 65  # the same budget
    assert node_hold_s(65, 10, reg(120, 10)) == 130  # set on the agents only: its own, never shorter
    assert node_hold_s(65, 10, reg(30, 5)) == 65
