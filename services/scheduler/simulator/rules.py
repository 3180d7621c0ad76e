"""How the simulator carries the policy's decisions out: the live executor's rules by default.

The live service (services/scheduler/app.py, schedule_request.py) never
splits a job that fits one node across nodes, moves only running one-node
jobs that resume from a checkpoint of their own, and carries a move out as a
stop order, a requeue, a hold until the old attempt has ended, and a new
placement by a later pass. `LIVE` is that; the other switches exist to
measure what each rule costs (bench/scheduler_trace.py --executor).

What still differs from the live service (docs/services/scheduler.md):
passes run at each instant with events (live: after events and at least
every `pass_interval_s`); a stop takes exactly `stop_s` (live: until the job
exits after SIGTERM, at most the grace period, or grace + `heartbeat_lost_s`
from a silent agent); a job placed on GPUs a stopping attempt still holds
starts at once (live: after the agent stopped the old one); a stop keeps all
the work done and a first attempt has no start-up latency; which trace jobs
keep a checkpoint is assumed from their class unless the CSV says; runtimes
follow the speed table; no failures, lost or drained nodes, leases, foreign
memory use, jobs without an estimate or services.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..placement import Placement
from ..queueing import PolicyConfig
from .workload import SimJob


@dataclass(frozen=True)
class ExecutorRules:
    # Live: a job that fits one node waits for one (the service's profile has no split_min_speed_ratio).
    split_jobs_that_fit_one_node: bool = False
    # Live: only a one-node job that keeps a checkpoint may be moved (`schedule_request.movable`).
    move_any_job: bool = False
    # Stop order -> the old attempt's end (its checkpoint written, within the agent's grace period):
    # the job is held that long before it is queued again.
    stop_s: float = 5.0
    # Start-up latency and checkpoint load of a resumed attempt (no work done meanwhile).
    resume_s: float = 60.0
    # A job stopped by a preemption is queued again with the estimate its last attempt left of it (less the
    # share of the attempt's expected length that ran), as live (`transitions.requeue`); a moved job keeps its
    # full estimate, as live (on: what the shorter estimate would do).
    remaining_estimate_after_preemption: bool = True
    remaining_estimate_after_move: bool = False

    def may_move(self, job: SimJob, placement: Placement) -> bool:
        """Whether the policy may move this job while it runs on `placement`."""
        return self.move_any_job or (not placement.others and job.keeps_checkpoint)


LIVE = ExecutorRules()


def executor_policy(policy: PolicyConfig, rules: ExecutorRules) -> PolicyConfig:
    """The policy as the executor runs it (live: no split of a job that fits one node)."""
    if rules.split_jobs_that_fit_one_node:
        return policy
    return replace(policy, profile=replace(policy.profile, split_min_speed_ratio=None))
