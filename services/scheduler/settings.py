"""The scheduler's settings (WHALEFLUX_* environment variables; see docs/services/scheduler.md)."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, Field, model_validator

from whaleflux.shared import job_paths
from whaleflux.shared.settings import CommonSettings

from .queueing import POLICIES, PolicyConfig, TeamPolicy


class TeamSettings(BaseModel):
    quota_gpus: int | None = Field(None, ge=0)
    weight: float = Field(1.0, gt=0)


class SchedulerSettings(CommonSettings):
    http_port: int = 8702
    pass_interval_s: float = Field(1.0, gt=0)
    policy: Literal["whaleflux", "backfill", "fifo"] = "whaleflux"
    # Quotas and fair-share weights: WHALEFLUX_TEAMS='{"nlp": {"quota_gpus": 8, "weight": 2}}',
    # or a YAML file `teams: {nlp: {quota_gpus: 8}}` (the file wins for teams in both).
    teams: dict[str, TeamSettings] = Field(default_factory=dict)
    teams_file: Path | None = None
    # Unset: the policy's own (queueing/jobs.py), as the simulator replays it.
    min_run_before_preemption_s: float | None = Field(None, ge=0)
    max_preemptions_per_job: int | None = Field(None, ge=0)
    preemption_grace_s: float = Field(5.0, ge=0, le=3600)
    heartbeat_suspect_s: float = Field(5.0, gt=0)
    heartbeat_lost_s: float = Field(10.0, gt=0)
    mass_silence_fraction: float = Field(0.5, gt=0, le=1)
    max_restarts: int = Field(3, ge=0)
    # A placement's start-by (its fencing token): its node never starts it later than this long after it was
    # placed, and the attempt is requeued once the node confirmed it did not (docs/services/scheduler.md).
    placement_report_s: float = Field(30.0, gt=0)
    # The nodes' self-fence budget, the same variable as the agent's (docs/services/agent.md): a job's supervisor
    # stops it once its agent got no heartbeat out for this long. A lost node's jobs are held at least this long
    # (plus the grace), so a job is never run again while its old attempt may still run.
    fence_after_s: float = Field(60.0, gt=0)
    # The job history is folded into a snapshot this often, keeping jobs that ended within
    # `keep_finished_days`: a rebuild after a lost store reads the snapshot and the stream's tail only.
    snapshot_interval_s: float = Field(300.0, gt=0)
    keep_finished_days: float = Field(7.0, gt=0)
    # Lease ends of leased and rented nodes, from inventory (empty: not asked).
    inventory_url: str = "http://127.0.0.1:8705"
    lease_refresh_s: float = Field(60.0, gt=0)
    # The policy's moves of running checkpointable jobs (to faster GPUs, out of a blocked job's way).
    migration: bool = True
    # GPU quarantine (docs/services/scheduler.md): a GPU out for a fault takes work again once it has reported
    # healthy this long without a break; a GPU of a live node that sends telemetry is missing after this long
    # without a sample of its own.
    gpu_quarantine_hold_s: float = Field(300.0, ge=0)
    gpu_missing_s: float = Field(30.0, gt=0)
    # Active/standby replicas: the leader's lease lives this long unless renewed
    # (every third of it); a standby takes over within about this long after the leader dies.
    leader_lease_s: float = Field(3.0, ge=0.3, le=60)
    # Absolute folders a team's jobs may name as workdir or checkpoint_dir besides their own area
    # (shared/job_paths.py): WHALEFLUX_TEAM_ROOTS='{"vision": ["/data/vision"], "*": ["/scratch"]}'. The agents
    # get the same setting and check again.
    team_roots: dict[str, list[str]] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _roots_are_folders(self) -> SchedulerSettings:
        job_paths.check_roots(self.team_roots)
        return self

    @model_validator(mode="after")
    def _lost_after_suspect(self) -> SchedulerSettings:
        if self.heartbeat_lost_s < self.heartbeat_suspect_s:
            raise ValueError("WHALEFLUX_HEARTBEAT_LOST_S must be >= WHALEFLUX_HEARTBEAT_SUSPECT_S")
        return self

    @property
    def hold_s(self) -> float:
        """How long a job sent a stop order waits for its old attempt's end before it is placed again: the
        grace period, then as long as a silent node takes to be declared lost or, if longer, as its supervisors
        take to fence themselves (an attempt on a silent node is stopped by then)."""
        return self.preemption_grace_s + max(self.heartbeat_lost_s, self.fence_after_s)

    def stop_hold(self, now: datetime) -> datetime:
        """Until when a job sent a stop order at `now` waits for its old attempt's end (see `hold_s`)."""
        return now + timedelta(seconds=self.hold_s)

    def team_policies(self) -> dict[str, TeamPolicy]:
        teams = dict(self.teams)
        if self.teams_file is not None:
            doc = yaml.safe_load(self.teams_file.read_text()) or {}
            teams.update({k: TeamSettings.model_validate(v or {}) for k, v in (doc.get("teams") or {}).items()})
        return {name: TeamPolicy(t.quota_gpus, t.weight) for name, t in teams.items()}

    def policy_config(self) -> PolicyConfig:
        policy = POLICIES[self.policy]
        config = dataclasses.replace(
            policy,
            # A job that fits on one node runs on one node: its command need not be written for
            # several (the simulator may split such a job when that is faster; the service never does).
            profile=dataclasses.replace(policy.profile, split_min_speed_ratio=None),
        )
        if self.min_run_before_preemption_s is not None:
            config = dataclasses.replace(config, min_run_before_preemption_s=self.min_run_before_preemption_s)
        if self.max_preemptions_per_job is not None:
            config = dataclasses.replace(config, max_preemptions_per_job=self.max_preemptions_per_job)
        if not self.migration:  # moves as the policy has them (the simulator's defaults), unless turned off
            config = dataclasses.replace(config, migrate_min_gain_s=None, make_room_by_migration=False)
        return config
