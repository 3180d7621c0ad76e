"""`whaleflux test-gpu`: burn in this node's GPUs (or simulated ones) and print each GPU's report card."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from .terminal import console, gpu_choice

if TYPE_CHECKING:
    from collections.abc import Callable

    from whaleflux.agent.burnin.plan import BurnInPlan
    from whaleflux.agent.burnin.run import BurnInReport
    from whaleflux.shared.events import GpuReportCard

# Exit codes: 0 every GPU passed or only warned, 1 a GPU failed, 2 the options are wrong or there is no GPU to test.
FAILED, UNUSABLE = 1, 2
STYLE = {"pass": "green", "warn": "yellow", "fail": "red"}


class IntensityChoice(str, enum.Enum):
    low = "low"
    normal = "normal"
    max = "max"


def _figure(card: GpuReportCard, check: str, name: str) -> float | None:
    for c in card.checks:
        if c.check == check:
            return c.figures.get(name)
    return None


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def render(report: BurnInReport) -> Table:
    """The report card of every GPU as one table: verdict, the main figures, and every reason."""
    table = Table(title=f"burn-in: {', '.join(report.checks)}, {report.duration_s:g} s stress, {report.intensity}")
    for column in ("GPU", "model", "verdict", "TFLOP/s fp32", "VRAM tested", "mismatches", "H2D/D2H GB/s", "max °C",
                   "reasons"):
        table.add_column(column, overflow="fold")
    for card in report.gpus:
        tflops, of_spec = _figure(card, "compute", "tflops_fp32"), _figure(card, "compute", "of_spec")
        coverage = _figure(card, "memory", "coverage")
        h2d, d2h = _figure(card, "bandwidth", "h2d_gbps"), _figure(card, "bandwidth", "d2h_gbps")
        table.add_row(
            str(card.index), card.model, f"[{STYLE[card.verdict]}]{card.verdict}[/]",
            _cell(tflops, ".1f") + (f" ({100 * of_spec:.0f}%)" if of_spec is not None else ""),
            _cell(None if coverage is None else 100 * coverage, ".0f") + ("%" if coverage is not None else ""),
            _cell(_figure(card, "memory", "mismatches"), ".0f"),
            f"{_cell(h2d, '.1f')} / {_cell(d2h, '.1f')}",
            _cell(_figure(card, "thermal", "max_temperature_c"), ".0f"),
            escape("; ".join(card.reasons)) or "-",
        )
    return table


def test_gpu(
    gpu: Annotated[str, typer.Option(help="all, a GPU index or a GPU UUID")] = "all",
    duration: Annotated[str, typer.Option(help="compute and thermal stress: 90s, 5m, 12h, 1h30m")] = "2m",
    intensity: Annotated[IntensityChoice, typer.Option(case_sensitive=False, help="how hard")] = IntensityChoice.normal,
    checks: Annotated[str, typer.Option(help="comma-separated: compute, memory, bandwidth, thermal")] =
        "compute,memory,bandwidth,thermal",
    json_out: Annotated[bool, typer.Option("--json", help="print the report as JSON instead of a table")] = False,
    report: Annotated[Path | None, typer.Option(help="also write the JSON report to this file")] = None,
    simulate: Annotated[str | None, typer.Option(help="burn in simulated GPUs of this model (H100, H200, A100, "
                                                      "RTX4090) instead of this machine's")] = None,
    gpus: Annotated[int, typer.Option(min=1, max=64, help="--simulate: how many GPUs")] = 8,
    inject: Annotated[list[str] | None, typer.Option(help="--simulate: a fault first, FAULT:GPU (e.g. cooling:2, "
                                                          "vram-flip:0, pcie-degraded:1); repeatable")] = None,
) -> None:
    """Burn in GPUs before they take work: compute, memory, bandwidth and thermal checks, a report card per GPU.

    On a node it needs only the NVIDIA driver and the `gpu` extra (pip install 'whaleflux[gpu]'). Exit code 1
    when a GPU fails, 2 when the options are wrong or there is no GPU to test.
    """
    from whaleflux.agent.burnin.local import burn_in_simulated
    from whaleflux.agent.burnin.plan import PlanError, make_plan

    def progress(line: str) -> None:
        if not json_out:
            console.print(f"[dim]{escape(line)}[/dim]")

    gpu_choice("--gpu", gpu)
    try:
        plan = make_plan(gpus=gpu, duration=duration, intensity=intensity.value, checks=checks)
        if simulate is not None:
            done = burn_in_simulated(plan, simulate, gpus, inject or (), progress=progress)
        elif inject:
            raise PlanError("--inject: faults are injected only into simulated GPUs (--simulate MODEL)")
        else:
            done = _burn_in_here(plan, progress)
    except PlanError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(UNUSABLE) from None
    document = done.model_dump_json(indent=2)
    if report is not None:
        report.write_text(document + "\n")
    if json_out:
        print(document)
    else:
        console.print(render(done))
        console.print(f"verdict: [{STYLE[done.verdict]}]{done.verdict}[/]")
    if done.verdict == "fail":
        raise typer.Exit(FAILED)


def _burn_in_here(plan: BurnInPlan, progress: Callable[[str], None]) -> BurnInReport:
    """This machine's GPUs; a machine without the driver or cuda-bindings is told what it lacks (exit 2)."""
    from whaleflux.agent.burnin.cuda import CudaUnavailable
    from whaleflux.agent.burnin.local import burn_in_here
    from whaleflux.agent.burnin.plan import PlanError

    try:
        return burn_in_here(plan, progress)
    except CudaUnavailable as exc:
        raise PlanError(str(exc)) from None
