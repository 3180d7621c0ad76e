"""Queue policy: priority classes, quotas, fair share, EASY backfill, gang, preemption. Pure."""

from .jobs import BACKFILL, FIFO, POLICIES, WHALEFLUX, PendingJob, PolicyConfig, RunningJob, TeamPolicy, rank
from .migration import Migration
from .pending import PendingQueue
from .preemption import Preemption
from .reservation import Reservation
from .running import RunningJobs
from .schedule import ScheduleReply, ScheduleRequest, Started, expected_runtime, schedule

__all__ = [
    "BACKFILL", "FIFO", "POLICIES", "WHALEFLUX", "Migration", "PendingJob", "PendingQueue", "PolicyConfig",
    "Preemption",
    "Reservation", "RunningJob", "RunningJobs", "ScheduleReply", "ScheduleRequest", "Started", "TeamPolicy",
    "expected_runtime", "rank", "schedule",
]
