"""Faults the simulated fleet can be told to suffer, what each one means, and the parameters each one takes.

The admin endpoint of the agent and `whaleflux sim inject` both speak `Fault`.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .fault_kinds import FAULT_HELP, FAULT_PARAMS, GPU_FAULTS, NO_DURATION, PARAMETERS, FaultKind

__all__ = ["FAULT_HELP", "FAULT_PARAMS", "GPU_FAULTS", "NO_DURATION", "PARAMETERS", "ClearFaults", "Fault",
           "FaultKind", "param_defaults"]


class Fault(BaseModel):
    """One fault to inject on one node (and one GPU of it, for GPU faults)."""

    model_config = ConfigDict(extra="forbid")
    kind: FaultKind
    node: str = Field(min_length=1, max_length=128)
    gpu: int | None = Field(None, ge=0, le=255, description="GPU index on the node; required for GPU faults")
    duration_s: float | None = Field(None, gt=0, le=86400, description="node-silent: how long; default until restart")
    leak_mib_per_s: float = Field(1024.0, gt=0, le=1048576, description="vram-leak: growth rate")
    memory_mib: float = Field(65536.0, gt=0, le=1048576,
                              description="foreign-memory: how much the foreign process holds")
    crc_errors: int = Field(5000, ge=1, le=10**9, description="nvlink-crc: errors in the burst")
    cooling_factor: float = Field(3.0, gt=1, le=20, description="cooling: thermal resistance multiplier")
    bits: int = Field(1, ge=1, le=2, description="vram-flip: bits flipped in the cell (ECC corrects 1, not 2)")

    @model_validator(mode="after")
    def _gpu_for_gpu_faults(self) -> Fault:
        if self.kind in GPU_FAULTS and self.gpu is None:
            raise ValueError(f"gpu: fault {self.kind!r} needs the index of a GPU on the node")
        if self.kind not in GPU_FAULTS and self.gpu is not None:
            raise ValueError(f"gpu: fault {self.kind!r} is a node fault; it takes no GPU")
        takes = FAULT_PARAMS.get(self.kind, ())
        for name in PARAMETERS:
            if name in self.model_fields_set and name not in takes:
                why = NO_DURATION if name == "duration_s" else "it takes " + (", ".join(takes) or "no parameters")
                raise ValueError(f"{name}: fault {self.kind!r} has no parameter {name}; {why}")
        return self


class ClearFaults(BaseModel):
    """Which simulated nodes to rid of their injected faults (`node` None: every node this agent runs)."""

    model_config = ConfigDict(extra="forbid")
    node: str | None = Field(None, min_length=1, max_length=128)


def param_defaults(kind: str) -> dict[str, object]:
    """The parameters `kind` takes and their defaults (None: until the agent restarts)."""
    return {name: Fault.model_fields[name].default for name in FAULT_PARAMS.get(kind, ())}
