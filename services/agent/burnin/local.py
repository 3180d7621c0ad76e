"""A burn-in of this machine's GPUs (NVML + CUDA), or of a simulated node: what `whaleflux test-gpu` and
scripts/hardware_check.py run."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from whaleflux.shared.catalog import gpu_models

from ..faults import Fault
from ..simulated import SimulatedNode
from .plan import BurnInPlan, PlanError
from .run import BurnInReport, run_burnin


def parse_injection(text: str, node: str) -> Fault:
    """"cooling:2" -> the cooling fault on GPU 2 of `node`; PlanError naming --inject otherwise."""
    kind, _, gpu = text.partition(":")
    try:
        return Fault(kind=kind, node=node, gpu=int(gpu) if gpu else None)  # type: ignore[arg-type]
    except ValueError as exc:
        raise PlanError(f"--inject: {text!r} is not FAULT:GPU (e.g. cooling:2, vram-flip:0): {exc}") from None


def burn_in_simulated(plan: BurnInPlan, model: str, gpus: int = 8, inject: Sequence[str] = (),
                      interconnect: str = "nvlink", progress: Callable[[str], None] = lambda _: None) -> BurnInReport:
    """Burn in a simulated node of `gpus` GPUs of `model`, with faults injected first (e.g. "cooling:2")."""
    from .simulated import SimulatedExerciser

    models = gpu_models()
    key = model.upper()
    if key not in models:
        raise PlanError(f"--simulate: no model {model!r}; choose from {', '.join(models)}")
    node = SimulatedNode("sim-01", models[key], gpus, interconnect=interconnect if models[key].nvlink_gbps else "pcie")
    for text in inject:
        fault = parse_injection(text, node.node)
        try:
            node.inject(fault)
        except ValueError as exc:
            raise PlanError(f"--inject: {exc}") from None
    return run_burnin(node, SimulatedExerciser(node, datetime.now(UTC)), plan, progress=progress)


def burn_in_here(plan: BurnInPlan, progress: Callable[[str], None] = lambda _: None) -> BurnInReport:
    """Burn in this machine's GPUs: sampled through NVML, exercised through the CUDA driver (the `gpu` extra)."""
    from ..nvml import NvmlBackend
    from .cuda import CudaExerciser, CudaUnavailable
    from .run import select_gpus

    try:
        import pynvml

        backend = NvmlBackend(pynvml)
    except pynvml.NVMLError as exc:
        raise CudaUnavailable(f"NVML: {exc} (test-gpu runs on a node with the NVIDIA driver)") from None
    try:
        chosen = select_gpus(backend.identities(), plan.gpus)
        first = backend.sample(datetime.now(UTC))
        nvlink = any((s.nvlink_links_active or 0) > 0 for s in first)
        exerciser = CudaExerciser(chosen, plan.intensity, peer_link="nvlink" if nvlink else "pcie")
        return run_burnin(backend, exerciser, plan, progress=progress)
    finally:
        backend.close()
