"""The CUDA burn-in's plumbing over a stand-in driver (tests/fake_cuda.py): kernels launched with the right
parameters, figures from CUDA event times, the memory test finding a flipped bit, errors naming the call."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from whaleflux.agent.burnin import ptx
from whaleflux.agent.burnin.cuda import COPY_BYTES, CudaError, CudaExerciser
from whaleflux.agent.burnin.plan import make_plan
from whaleflux.agent.burnin.run import run_burnin
from whaleflux.agent.simulated import SimulatedNode
from whaleflux.shared.catalog import gpu_models

from .fake_cuda import FakeCuda


def node(gpus: int = 2) -> SimulatedNode:
    return SimulatedNode("h200-01", gpu_models()["H200"], gpus, interconnect="nvlink")


def exerciser(n: SimulatedNode, **fake) -> tuple[CudaExerciser, FakeCuda]:
    # The simulator's bus ids in reverse: CUDA ordinals are matched to NVML's indices by bus id, not by number.
    ids = n.identities()
    cuda = FakeCuda(bus_ids=[g.pci_bus_id.upper() for g in reversed(ids) if g.pci_bus_id], **fake)
    return CudaExerciser(ids, "normal", peer_link="nvlink", driver=cuda, clock=lambda: datetime.now(UTC)), cuda


def test_the_ptx_is_loaded_on_each_gpu_and_its_kernels_found():
    ex, cuda = exerciser(node())
    assert cuda.loaded == [ptx.module()] * 2
    assert {i: g.device for i, g in ex.gpus.items()} == {0: 1, 1: 0}  # by PCI bus id
    assert all(set(g.fns) == set(ptx.KERNELS) for g in ex.gpus.values())
    ex.close()
    assert cuda.buffers == {}


def test_compute_counts_the_flops_of_every_launch_in_event_time():
    ex, cuda = exerciser(node(1), fma_flops_per_s=40e12)
    [(index, run)] = ex.compute([0], 0.5).items()
    assert index == 0 and run.tflops == pytest.approx(40.0)
    fma = [launch for launch in cuda.launches if launch[0] == "wf_fma"]
    _, blocks, threads, (out, iters) = fma[-1]
    assert blocks == cuda.sms * 4 and threads == 256 and out in cuda.buffers
    # Calibrated so that one launch lasts about 50 ms: the half second is about ten of them.
    assert 0.45 <= run.seconds <= 0.6 and iters > 512
    ex.close()


def test_the_memory_test_covers_the_free_memory_with_every_pattern():
    ex, cuda = exerciser(node(1))
    [run] = ex.memory([0], 0.9).values()
    assert run.mismatches == 0 and run.passes == len(ptx.PATTERNS)
    assert run.bytes_tested == pytest.approx(0.9 * cuda.free, rel=0.02) and run.bytes_tested % 8 == 0
    writes = [v for fn, _, _, v in cuda.launches if fn == "wf_mem_write"]
    assert [(mask, pattern) for _, _, mask, pattern in writes] == [(m, p) for _, m, p in ptx.PATTERNS]
    assert list(cuda.buffers) == [ex.gpus[0].out]  # the test's buffers are freed
    ex.close()


def test_a_flipped_bit_is_found_at_its_offset_by_every_pattern():
    ex, _ = exerciser(node(1), flip={0: 1000})
    [run] = ex.memory([0], 0.9).values()
    assert run.mismatches == 4 and run.bad_addresses == (8000,) * 4
    ex.close()


def test_copy_bandwidth_from_event_time():
    ex, cuda = exerciser(node(2), pcie_bytes_per_s=52e9, memory_bytes_per_s=4e12, peer_bytes_per_s=380e9)
    runs = ex.bandwidth([0, 1])
    assert runs[0].h2d_gbps == pytest.approx(52.0) and runs[0].d2h_gbps == pytest.approx(52.0)
    assert runs[0].d2d_gbps == pytest.approx(4000.0) and runs[1].peer_gbps == {0: pytest.approx(380.0)}
    assert COPY_BYTES not in {b.size for b in cuda.buffers.values()}  # every copy buffer freed
    ex.close()


def test_a_whole_burn_in_through_the_cuda_path_is_judged():
    n = node(1)
    ex, _ = exerciser(n, fma_flops_per_s=30e12, flip={0: 7})
    report = run_burnin(n, ex, make_plan(duration="3s"))
    [card] = report.gpus
    assert card.verdict == "fail"
    assert card.reasons[0] == "compute: 30.0 TFLOP/s fp32, 55% under the H200's 67"
    assert card.reasons[1] == "memory: 4 mismatches in 0.0 GB tested (at 0x38)"


def test_a_failing_driver_call_is_named():
    with pytest.raises(CudaError, match="cuModuleGetFunction: CUDA_ERROR_NOT_FOUND"):
        exerciser(node(1), refuse={"cuModuleGetFunction"})
