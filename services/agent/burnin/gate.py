"""The validation gate: a node whose GPUs have not passed a burn-in is held back (not registered) until they do.

Policy (WHALEFLUX_VALIDATION): `off`; `first`: burn in when the node has no validation record yet, when its GPUs
changed, when the last burn-in left a GPU failing, or after a GPU fault the agent saw (a critical XID, a new
uncorrectable ECC error, a GPU that stopped answering) and marked on the record; `always`: at every start.
A node with attempts still running (taken up after an agent restart) is never burnt in: its record stands.

While the burn-in runs the node is not registered, so the scheduler places nothing on it; afterwards it
registers only the GPUs that passed or warned; a failing GPU stays out (quarantined) with its report card in
the record and in gpu.validated. The record is a JSON file per node under $WHALEFLUX_HOME/validation.
`needs_validation`, `usable` and `fault_seen` are pure; `load` and `save` read and write the record.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

import structlog
from pydantic import AwareDatetime, BaseModel, ConfigDict, ValidationError

from whaleflux.shared.events import GpuIdentity, GpuSample, GpuValidated

from ..backend import GpuBackend
from .card import CRITICAL_XIDS
from .plan import BurnInPlan
from .run import BurnInReport, Exerciser, run_burnin, unusable

log = structlog.get_logger("whaleflux.agent.burnin")

Policy = Literal["off", "first", "always"]


class ValidationRecord(BaseModel):
    """A node's last burn-in, and a GPU fault seen since (which asks for another)."""

    model_config = ConfigDict(extra="forbid")
    cluster: str
    node: str
    report: BurnInReport
    fault: str | None = None
    fault_at: AwareDatetime | None = None

    def verdicts(self) -> dict[str, str]:
        return {card.uuid: card.verdict for card in self.report.gpus}


def needs_validation(policy: Policy, record: ValidationRecord | None, gpus: list[GpuIdentity],
                     running_attempts: int) -> str | None:
    """Why the node must be burnt in before it registers, or None."""
    if policy == "off" or not gpus:
        return None
    if running_attempts:
        return None  # its GPUs are busy with jobs that outlived the agent: never burn them in under a job
    if policy == "always":
        return "every start (WHALEFLUX_VALIDATION=always)"
    if record is None:
        return "first registration: no burn-in on record"
    if record.fault is not None:
        return f"a GPU fault since the last burn-in: {record.fault}"
    known = record.verdicts()
    new = [g.index for g in gpus if g.uuid not in known]
    if new:
        return f"GPU(s) {', '.join(map(str, new))} not burnt in yet"
    failed = [g.index for g in gpus if known[g.uuid] == "fail"]
    if failed:
        return f"GPU(s) {', '.join(map(str, failed))} failed the last burn-in"
    return None


def usable(gpus: list[GpuIdentity], record: ValidationRecord | None, policy: Policy) -> list[GpuIdentity]:
    """The GPUs the node registers: all of them without a gate, else those whose last burn-in passed or warned."""
    if policy == "off" or record is None:
        return list(gpus)
    verdicts = record.verdicts()
    return [g for g in gpus if verdicts.get(g.uuid) in ("pass", "warn")]


def fault_seen(samples: Iterable[GpuSample], before: dict[str, GpuSample], expected: set[str]) -> str | None:
    """A GPU fault in this batch that calls for a new burn-in: a critical XID, a new uncorrectable ECC error,
    or a GPU of `expected` (UUIDs) missing from the batch."""
    seen = {}
    for s in samples:
        seen[s.uuid] = s
        critical = sorted(set(s.xid_errors) & CRITICAL_XIDS)
        if critical:
            return f"XID {', '.join(map(str, critical))} on GPU {s.index}"
        old = before.get(s.uuid)
        if old is not None and (s.ecc_uncorrected or 0) > (old.ecc_uncorrected or 0):
            return f"new uncorrectable ECC error(s) on GPU {s.index}"
    missing = sorted(expected - set(seen))
    if missing:
        gone = before.get(missing[0])
        return f"GPU {gone.index if gone is not None else missing[0]} stopped answering"
    return None


def record_path(home: Path, cluster: str, node: str) -> Path:
    return home / "validation" / cluster / f"{node}.json"


def load(path: Path) -> ValidationRecord | None:
    """The record, or None when there is none (or it cannot be read: then the node is burnt in again)."""
    try:
        return ValidationRecord.model_validate_json(path.read_text())
    except (OSError, ValidationError, ValueError):
        return None


def save(path: Path, record: ValidationRecord) -> None:
    """Write the record atomically (a crash leaves the old one or the new one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(record.model_dump_json(indent=2))
    os.replace(tmp, path)


@dataclass
class NodeGate:
    """One node's gate: burns it in at start when the policy says so, and marks the record on a GPU fault."""

    cluster: str
    node: str
    policy: Policy
    plan: BurnInPlan
    path: Path
    exerciser: Callable[[list[GpuIdentity]], Exerciser]  # made only when a burn-in runs
    record: ValidationRecord | None = None
    _before: dict[str, GpuSample] = field(default_factory=dict)
    _expected: set[str] = field(default_factory=set)

    async def admit(self, backend: GpuBackend, running_attempts: int) -> tuple[list[GpuIdentity], GpuValidated | None]:
        """The GPUs to register, and the burn-in's gpu.validated if one ran (in a thread: it blocks for its time)."""
        self.record = load(self.path)
        gpus = backend.identities()
        reason = needs_validation(self.policy, self.record, gpus, running_attempts)
        validated = None
        if reason is not None:
            log.warning("agent.validating", node=self.node, reason=reason, duration_s=self.plan.duration_s)
            report = await self._burn_in(backend, gpus)
            self.record = ValidationRecord(cluster=self.cluster, node=self.node, report=report)
            save(self.path, self.record)
            log.warning("agent.validated", node=self.node, verdict=report.verdict,
                        failed=[c.index for c in report.gpus if c.verdict == "fail"])
            validated = report.validated(self.cluster, self.node, reason)
        admitted = usable(gpus, self.record, self.policy)
        self._expected = {g.uuid for g in admitted}
        return admitted, validated

    async def _burn_in(self, backend: GpuBackend, gpus: list[GpuIdentity]) -> BurnInReport:
        try:
            return await asyncio.to_thread(lambda: run_burnin(backend, self.exerciser(gpus), self.plan))
        except Exception as exc:  # noqa: BLE001  (a burn-in that cannot run fails the GPUs; the agent runs on)
            log.error("agent.burn_in_failed", node=self.node, error=repr(exc))
            return unusable(gpus, self.plan, datetime.now(UTC), f"the burn-in could not run: {exc}")

    def status(self, now: datetime) -> dict[str, object]:
        """The node's validation state and age, as the agent's /v1/nodes shows it."""
        record = self.record
        if record is None:
            return {"policy": self.policy, "state": "none"}
        verdicts = record.verdicts()
        return {"policy": self.policy, "state": record.report.verdict,
                "age_s": round((now - record.report.finished_at).total_seconds()),
                "quarantined": sorted(c.index for c in record.report.gpus if verdicts[c.uuid] == "fail"),
                "fault": record.fault}

    def watch(self, samples: list[GpuSample], now: datetime) -> None:
        """After each telemetry sample: a GPU fault goes on the record, so the next start burns the node in."""
        if self.policy != "off" and self.record is not None and self.record.fault is None:
            fault = fault_seen(samples, self._before, self._expected)
            if fault is not None:
                self.record = self.record.model_copy(update={"fault": fault, "fault_at": now})
                save(self.path, self.record)
                log.error("agent.gpu_fault_recorded", node=self.node, fault=fault)
        self._before = {s.uuid: s for s in samples}
