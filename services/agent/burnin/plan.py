"""What a burn-in runs: which GPUs, which checks, for how long, how hard. Parsed from the command line or settings."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, get_args

Check = Literal["compute", "memory", "bandwidth", "thermal"]
Intensity = Literal["low", "normal", "max"]
CHECKS: tuple[Check, ...] = get_args(Check)
INTENSITIES: tuple[Intensity, ...] = get_args(Intensity)

# Share of the free VRAM the memory test takes, by intensity (the driver and other processes keep the rest).
MEMORY_FRACTION: dict[Intensity, float] = {"low": 0.5, "normal": 0.9, "max": 0.95}
# Thread blocks per SM of the compute kernel, by intensity (low leaves the GPU room to breathe).
BLOCKS_PER_SM: dict[Intensity, int] = {"low": 1, "normal": 4, "max": 8}
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


class PlanError(ValueError):
    """A burn-in option is wrong; the message names it."""


@dataclass(frozen=True)
class BurnInPlan:
    """`gpus`: "all", an index or a UUID; `duration_s`: the compute and thermal stress (memory and copies follow)."""

    gpus: str = "all"
    duration_s: float = 120.0
    intensity: Intensity = "normal"
    checks: tuple[Check, ...] = CHECKS
    # How often the GPUs are sampled during the stress (1 s, like the agent's telemetry).
    sample_every_s: float = 1.0

    @property
    def memory_fraction(self) -> float:
        return MEMORY_FRACTION[self.intensity]

    @property
    def stresses(self) -> bool:
        """Whether the compute kernel runs: for the compute figure, and to heat the GPU for the thermal check."""
        return "compute" in self.checks or "thermal" in self.checks


def parse_duration(text: str) -> float:
    """Seconds in "90", "90s", "5m", "12h", "1d" or "1h30m"."""
    value = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", value):
        seconds = float(value)
    else:
        parts = re.findall(r"(\d+(?:\.\d+)?)([smhd])", value)
        if not parts or "".join(n + u for n, u in parts) != value:
            raise PlanError(f"--duration: {text!r} is not a duration (e.g. 90s, 5m, 12h, 1h30m)")
        seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if not 1 <= seconds <= 7 * 86400:
        raise PlanError(f"--duration: {text!r} is outside 1 s to 7 days")
    return seconds


def parse_checks(text: str) -> tuple[Check, ...]:
    """"compute,memory" -> ("compute", "memory"), in the canonical order; unknown names are an error."""
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    unknown = sorted(set(names) - set(CHECKS))
    if unknown or not names:
        raise PlanError(f"--checks: {', '.join(unknown) or 'none given'}; choose from {', '.join(CHECKS)}")
    return tuple(c for c in CHECKS if c in names)


def make_plan(gpus: str = "all", duration: str = "2m", intensity: str = "normal",
              checks: str = ",".join(CHECKS)) -> BurnInPlan:
    """A plan from the command line's words; PlanError names the option that is wrong."""
    level = intensity.strip().lower()
    if level not in INTENSITIES:
        raise PlanError(f"--intensity: {intensity!r}; choose from {', '.join(INTENSITIES)}")
    return BurnInPlan(gpus=gpus.strip() or "all", duration_s=parse_duration(duration), intensity=level,
                      checks=parse_checks(checks))
