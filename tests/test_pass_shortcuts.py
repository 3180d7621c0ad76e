"""A pass skips work whose answer it already knows, with the decisions it would make doing the work.

A job of a shape the head's reservation just refused, in the same state of the cluster, is not placed again
to be refused again unless it could end by the reserved start, and the candidates of one that cannot end by
it are not scored when each is on a node the reservation refuses it (`place_on(refused=...)`, `REFUSED`); a
move to faster GPUs that the reservations refused is not tried again for a job that cannot end by every
reserved start either, nor scored when every candidate is refused (queueing/schedule.py `_kept_by_reservation`,
`_refuser`, queueing/moves_up.py `plan_migrations`, `_refuser`); the blocked head gets no room made by moves
(nodes walked, moves tried and undone) when fewer GPUs are free than it needs (`room_possible`); a move up
is not weighed for a job none of whose models has as many GPUs free as it holds (`free_targets`), and the
running jobs are not walked for moves up at all when no group of them could run faster on a model with that
many GPUs free (`_some_may_gain`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import replace

import pytest

from whaleflux.scheduler.placement import (
    ClusterState,
    GpuState,
    JobRequest,
    ModelFacts,
    NodeState,
    place_on,
)
from whaleflux.scheduler.placement.framework import REFUSED
from whaleflux.scheduler.queueing import (
    WHALEFLUX,
    PendingJob,
    PendingQueue,
    RunningJob,
    RunningJobs,
    ScheduleRequest,
    schedule,
)
from whaleflux.scheduler.queueing.reservation import Reservations

from .random_passes import run_passes

QUIET = replace(WHALEFLUX, preemption=False, make_room_by_migration=False, migrate_min_gain_s=None, aging_s=None)
SPEEDS = {"A100": 1.0, "H100": 2.6}
FACTS = {m: ModelFacts(m, {"small": s}) for m, s in SPEEDS.items()}


def node(name: str, model: str = "A100", size: int = 8) -> NodeState:
    return NodeState(name, "c", model, "nvlink", tuple(GpuState(f"{name}-g{g}", g, 81920) for g in range(size)))


def hold(cluster: ClusterState, running: RunningJobs, job_id: str, node_name: str, gpus: int, end: float,
         **movable: object) -> None:
    """A job already running on `gpus` GPUs of one node, ending at `end`."""
    req = JobRequest(job_id, gpus, gpu_models=(cluster.nodes[node_name].model,), expected_runtime_s=end)
    placement = place_on(cluster, req, QUIET.profile, 0.0)
    assert placement.node == node_name  # type: ignore[union-attr]
    cluster.allocate(job_id, placement)  # type: ignore[arg-type]
    running[job_id] = RunningJob(job_id, "t", "normal", False, gpus, 0.0, end, **movable)  # type: ignore[arg-type]


def pending(job_id: str, gpus: int, runtime: float, seq: int, **more: object) -> PendingJob:
    return PendingJob(JobRequest(job_id, gpus, expected_runtime_s=runtime, **more), 0.0, seq)  # type: ignore[arg-type]


def test_a_job_of_a_refused_shape_that_ends_by_the_reserved_start_still_backfills():
    cluster, running = ClusterState([node("n0"), node("n1")], FACTS), RunningJobs()
    hold(cluster, running, "r0", "n0", 4, end=1000.0)  # n0 is whole at t=1000: the head's start
    hold(cluster, running, "r1", "n1", 8, end=9000.0)
    queue = PendingQueue(QUIET)
    for i, (job_id, runtime) in enumerate([("long-a", 3000.0), ("long-b", 4000.0), ("short", 500.0),
                                           ("long-c", 5000.0)], start=1):
        queue.add(pending(job_id, 1, runtime, i))
    queue.add(pending("head", 8, 100.0, 0))
    reply = schedule(ScheduleRequest(0.0, cluster, queue, running, QUIET))
    assert reply.reservation is not None and reply.reservation.job_id == "head" and reply.reservation.start == 1000
    assert [s.job.job_id for s in reply.started] == ["short"], reply.waiting
    assert reply.started[0].placement.node == "n0" and reply.started[0].backfilled
    for job_id in ("long-a", "long-b", "long-c"):
        assert reply.waiting[job_id].startswith("would delay head, reserved to start at {at:1000} on n0"), job_id


def test_a_move_the_reservation_refused_is_still_made_for_a_job_that_ends_by_the_reserved_start():
    policy = replace(QUIET, migrate_min_gain_s=600.0)
    cluster, running = ClusterState([node("fast", "H100"), node("slow", "A100")], FACTS), RunningJobs()
    hold(cluster, running, "r0", "fast", 4, end=1000.0)
    for job_id, end in (("long-a", 20_000.0), ("long-b", 21_000.0), ("short", 1_500.0)):
        hold(cluster, running, job_id, "slow", 1, end=end, request=JobRequest(job_id, 1, expected_runtime_s=end),
             speed=1.0, checkpointable=True)
    queue = PendingQueue(policy)
    queue.add(pending("head", 8, 100.0, 0, gpu_models=("H100",)))
    reply = schedule(ScheduleRequest(0.0, cluster, queue, running, policy))
    assert reply.reservation is not None and reply.reservation.start == 1000 and not reply.started
    # 60 s to restart and 1,500 s at 2.6x: done at t=637, before the head starts; the others would delay it.
    assert [(m.job_id, m.placement.node) for m in reply.migrated] == [("short", "fast")]


SEEDS = range(16)


def record(monkeypatch: pytest.MonkeyPatch, owner: object, name: str,
           judge: Callable[[object], bool]) -> tuple[list[list[str]], list[bool]]:
    """Every random pass's log with the shortcut `owner.name` on, and what `judge` said of each of its answers."""
    known, said = getattr(owner, name), []

    def counted(*args: object, **kwargs: object) -> object:
        answer = known(*args, **kwargs)
        said.append(judge(answer))
        return answer

    monkeypatch.setattr(owner, name, counted)
    return [run_passes(seed) for seed in SEEDS], said


def assert_same_without(monkeypatch: pytest.MonkeyPatch, logs: list[list[str]], *off: tuple[object, str, object]):
    """The same decisions and reasons, pass by pass, with each shortcut `(owner, name, value)` replaced."""
    for owner, name, value in off:
        monkeypatch.setattr(owner, name, value)
    for seed, log in zip(SEEDS, logs, strict=True):
        assert run_passes(seed) == log, f"seed {seed}"


def test_the_shortcuts_keep_every_decision_and_reason_over_random_states(monkeypatch: pytest.MonkeyPatch):
    passes = sys.modules["whaleflux.scheduler.queueing.schedule"]._Pass
    with_shortcuts, taken = record(monkeypatch, passes, "_kept_by_reservation", lambda why: why is not None)
    assert sum(taken) > 100, "the shortcut is taken"
    assert_same_without(monkeypatch, with_shortcuts,
                        (passes, "_kept_by_reservation", lambda *_: None),  # always place the job to know
                        (Reservations, "ends_after_all", lambda *_: False))  # always try the move
    text = "".join("".join(log) for log in with_shortcuts)
    assert text.count("Started(") > 800 and text.count("would delay") > 1000 and text.count("Migration(") > 5, (
        text.count("Started("), text.count("would delay"), text.count("Migration("))


def test_no_room_is_made_when_fewer_gpus_are_free_than_the_head_needs(monkeypatch: pytest.MonkeyPatch):
    migration = sys.modules["whaleflux.scheduler.queueing.migration"]
    with_bound, said = record(monkeypatch, migration, "room_possible", bool)
    assert said.count(False) > 50 and said.count(True) > 50, (said.count(False), said.count(True))
    # Always walk the nodes and try the moves.
    assert_same_without(monkeypatch, with_bound, (migration, "room_possible", lambda *_: True))
    text = "".join("".join(log) for log in with_bound)
    assert text.count("to make room for") >= 1, text.count("to make room for")  # rooms are still made


def test_moves_up_skip_jobs_whose_models_have_too_few_gpus_free(monkeypatch: pytest.MonkeyPatch):
    migration = sys.modules["whaleflux.scheduler.queueing.moves_up"]
    with_skip, found = record(monkeypatch, migration, "free_targets", bool)
    assert found.count(False) > 20 and found.count(True) > 20, (found.count(False), found.count(True))
    # Every model of the job's view, free or not (each candidate then checks every one, as before the skip).
    assert_same_without(monkeypatch, with_skip,
                        (migration, "free_targets", lambda _cluster, models, _gpus: tuple(models)))
    text = "".join("".join(log) for log in with_skip)
    assert text.count("migrate to faster GPUs") >= 5, text.count("migrate to faster GPUs")  # moves are still made


def test_moves_up_walk_no_running_job_when_no_group_of_them_could_gain(monkeypatch: pytest.MonkeyPatch):
    moves_up = sys.modules["whaleflux.scheduler.queueing.moves_up"]
    with_exit, said = record(monkeypatch, moves_up, "_some_may_gain", bool)
    assert said.count(False) > 20 and said.count(True) > 20, (said.count(False), said.count(True))
    # Always walk the running jobs.
    assert_same_without(monkeypatch, with_exit, (moves_up, "_some_may_gain", lambda *_: True))
    text = "".join("".join(log) for log in with_exit)
    assert text.count("migrate to faster GPUs") >= 5, text.count("migrate to faster GPUs")  # moves are still made


@pytest.mark.parametrize("module", ["schedule", "moves_up"])
def test_candidates_all_on_refused_nodes_are_not_scored_to_be_refused(monkeypatch: pytest.MonkeyPatch, module: str):
    core = sys.modules[f"whaleflux.scheduler.queueing.{module}"]
    owner = core._Pass if module == "schedule" else core
    place, answers = core.place_on, []

    def counted(*args: object, **kwargs: object) -> object:
        decision = place(*args, **kwargs)  # type: ignore[arg-type]
        if kwargs.get("refused") is not None:
            answers.append(decision is REFUSED)
        return decision

    monkeypatch.setattr(core, "place_on", counted)
    with_shortcut = [run_passes(seed) for seed in SEEDS]
    assert answers.count(True) > 5 and answers.count(False) > 5, (answers.count(True), answers.count(False))
    assert_same_without(monkeypatch, with_shortcut, (owner, "_refuser", lambda *_: None))  # always score them
    text = "".join("".join(log) for log in with_shortcut)
    made = "backfilled=True" if module == "schedule" else "migrate to faster GPUs"
    assert text.count(made) >= 5, text.count(made)  # backfills and moves are still made


def decisions(log: list[str]) -> list[str]:
    """A pass's decisions from its reply's repr: starts, preemptions, moves, rejections (not the reasons)."""
    return [line.split(", waiting=")[0] + line.split("migrated=")[1] for line in log]


def test_victim_searches_skipped_for_later_blocked_jobs_keep_every_decision(monkeypatch: pytest.MonkeyPatch):
    # Shortest remaining first for every blocked job skips a search when no running job could be a victim or one
    # of the same key and a shorter estimate failed since the last GPU was freed (`_may_find_victims`,
    # `_failed_before`): turning the shortcuts off changes nothing but the work (searches unbounded here, so
    # the extra ones do not use up `max_preemption_searches`).
    from . import random_passes

    monkeypatch.setattr(random_passes, "WHALEFLUX", replace(WHALEFLUX, max_preemption_searches=None))
    passes = sys.modules["whaleflux.scheduler.queueing.schedule"]._Pass
    with_no_victims, none_could = record(monkeypatch, passes, "_may_find_victims", lambda may: not may)
    _, known = record(monkeypatch, passes, "_failed_before", bool)
    assert sum(none_could) > 50 and sum(known) > 20, (sum(none_could), sum(known))
    monkeypatch.setattr(passes, "_may_find_victims", lambda *_: True)
    monkeypatch.setattr(passes, "_failed_before", lambda *_: False)
    for seed, log in zip(SEEDS, with_no_victims, strict=True):
        assert decisions(run_passes(seed)) == decisions(log), f"seed {seed}"
    text = "".join("".join(log) for log in with_no_victims)
    assert text.count("stopped for the shorter job") > 10, text.count("stopped for the shorter job")
