"""The burn-in on real GPUs through the CUDA driver API: NVIDIA's cuda-bindings (the `gpu` extra), no toolkit.

The kernels (ptx.py) are loaded as PTX with cuModuleLoadData and JIT-compiled
by the driver for whatever GPU it finds. Imported only by `test-gpu` and the
agent's validation gate on an NVML node, never by anything else: the base
install and the tests run without it (the simulated exerciser covers them).

GPUs are matched to NVML's by PCI bus id, so index N here is NVML's GPU N
whatever CUDA_VISIBLE_DEVICES or CUDA's own ordering say.
"""

from __future__ import annotations

import ctypes
import importlib
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from whaleflux.shared.events import GpuIdentity

from . import ptx
from .card import BandwidthRun, ComputeRun, MemoryRun
from .plan import BLOCKS_PER_SM, Intensity

THREADS = 256
LAUNCH_S = 0.05  # one compute launch lasts about this long, so a step's end is never far off
CALIBRATION_ITERS = 512
COPY_BYTES = 256 * 1024 * 1024
COPY_REPS = 8
MEMORY_BLOCKS_PER_SM = 8


class CudaUnavailable(RuntimeError):
    """No CUDA on this machine (no cuda-bindings, no driver, no GPU); the message says what to do."""


class CudaError(RuntimeError):
    """A CUDA driver call failed; the message names the call and the error."""


def load_driver() -> Any:
    """cuda.bindings.driver, or CudaUnavailable with how to install it."""
    try:
        return importlib.import_module("cuda.bindings.driver")
    except ImportError as exc:
        raise CudaUnavailable("the GPU burn-in needs NVIDIA's cuda-bindings: pip install 'whaleflux[gpu]'") from exc


def _args(*values: Any) -> tuple[Any, tuple[Any, ...]]:
    """A kernel's parameter array (void*[]) and the values it points at, both to be kept alive until launch."""
    array = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
    return array, values


@dataclass
class _Gpu:
    index: int
    device: Any
    ctx: Any
    stream: Any
    module: Any
    fns: dict[str, Any]
    sms: int
    out: Any = None  # the compute kernel's output, one float per thread
    iters: int = CALIBRATION_ITERS
    launch_s: float = 0.0
    buffers: list[Any] = field(default_factory=list)


class CudaExerciser:
    """Exerciser over this machine's GPUs (those of `identities`, by NVML index)."""

    def __init__(self, identities: list[GpuIdentity], intensity: Intensity = "normal", peer_link: str = "pcie",
                 driver: Any = None, clock: Callable[[], datetime] = lambda: datetime.now(UTC)):
        # CUDA's ordinals then follow the PCI bus, like NVML's indices, where a bus id cannot be matched.
        os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        self.cu = driver or load_driver()
        self._clock = clock
        self.peer_link = peer_link
        self.blocks_per_sm = BLOCKS_PER_SM[intensity]
        try:
            self._call("cuInit", 0)
        except RuntimeError as exc:  # CudaError, or cuda-bindings finding no libcuda (no driver)
            raise CudaUnavailable(f"no usable NVIDIA driver or GPU: {exc}") from None
        self.gpus = {g.index: self._open(g) for g in identities}

    # ----------------------------------------------------------------- driver plumbing

    def _call(self, name: str, *args: Any) -> Any:
        """Call a driver function; its outputs (one value, a tuple, or None), or CudaError naming it."""
        result = getattr(self.cu, name)(*args)
        err, *values = result if isinstance(result, tuple) else (result,)
        if err != self.cu.CUresult.CUDA_SUCCESS:
            _, text = self.cu.cuGetErrorName(err)
            raise CudaError(f"{name}: {text.decode() if isinstance(text, bytes) else text}")
        return values[0] if len(values) == 1 else (tuple(values) or None)

    def _device(self, g: GpuIdentity) -> Any:
        if g.pci_bus_id:
            try:
                return self._call("cuDeviceGetByPCIBusId", g.pci_bus_id.encode())
            except CudaError:
                pass  # e.g. hidden by CUDA_VISIBLE_DEVICES: fall back to the ordinal
        return self._call("cuDeviceGet", g.index)

    def _open(self, g: GpuIdentity) -> _Gpu:
        device = self._device(g)
        ctx = self._call("cuDevicePrimaryCtxRetain", device)
        self._call("cuCtxSetCurrent", ctx)
        image = ctypes.create_string_buffer(ptx.module().encode())
        module = self._call("cuModuleLoadData", ctypes.addressof(image))
        fns = {n: self._call("cuModuleGetFunction", module, n.encode()) for n in ptx.KERNELS}
        sm_count = self.cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
        sms = self._call("cuDeviceGetAttribute", sm_count, device)
        gpu = _Gpu(g.index, device, ctx, self._call("cuStreamCreate", 0), module, fns, int(sms))
        gpu.out = self._alloc(gpu, self._threads(gpu) * 4)
        return gpu

    def _use(self, gpu: _Gpu) -> None:
        self._call("cuCtxSetCurrent", gpu.ctx)

    def _alloc(self, gpu: _Gpu, nbytes: int) -> Any:
        ptr = self._call("cuMemAlloc", nbytes)
        gpu.buffers.append(ptr)
        return ptr

    def _free(self, gpu: _Gpu, ptr: Any) -> None:
        gpu.buffers.remove(ptr)
        self._call("cuMemFree", ptr)

    def _launch(self, gpu: _Gpu, fn: str, blocks: int, *values: Any) -> None:
        params, _keep = _args(*values)
        self._call("cuLaunchKernel", gpu.fns[fn], blocks, 1, 1, THREADS, 1, 1, 0, gpu.stream,
                   ctypes.addressof(params), 0)

    def _timed(self, gpu: _Gpu, work: Callable[[], None]) -> float:
        """Seconds the work queued on the GPU's stream took, by CUDA events."""
        start, end = self._call("cuEventCreate", 0), self._call("cuEventCreate", 0)
        try:
            self._call("cuEventRecord", start, gpu.stream)
            work()
            self._call("cuEventRecord", end, gpu.stream)
            self._call("cuEventSynchronize", end)
            return float(self._call("cuEventElapsedTime", start, end)) / 1000
        finally:
            self._call("cuEventDestroy", start)
            self._call("cuEventDestroy", end)

    # ----------------------------------------------------------------- compute

    def _threads(self, gpu: _Gpu) -> int:
        return gpu.sms * self.blocks_per_sm * THREADS

    def _fma(self, gpu: _Gpu, iters: int) -> None:
        self._launch(gpu, "wf_fma", gpu.sms * self.blocks_per_sm, ctypes.c_uint64(int(gpu.out)), ctypes.c_uint32(iters))

    def _calibrate(self, gpu: _Gpu) -> None:
        """Pick the loop count that makes one launch last about LAUNCH_S (the first launch also JIT-warms)."""
        self._use(gpu)
        self._timed(gpu, lambda: self._fma(gpu, CALIBRATION_ITERS))
        took = self._timed(gpu, lambda: self._fma(gpu, CALIBRATION_ITERS))
        gpu.iters = max(CALIBRATION_ITERS, min(2**31 - 1, int(CALIBRATION_ITERS * LAUNCH_S / max(took, 1e-6))))
        gpu.launch_s = self._timed(gpu, lambda: self._fma(gpu, gpu.iters))

    def now(self) -> datetime:
        return self._clock()

    def compute(self, indices: list[int], seconds: float) -> dict[int, ComputeRun]:
        """Queue about `seconds` of FMA launches on every GPU, then wait for all: they run at once."""
        events = {}
        for i in indices:
            gpu = self.gpus[i]
            if not gpu.launch_s:
                self._calibrate(gpu)
            self._use(gpu)
            launches = max(1, math.ceil(seconds / gpu.launch_s))
            start, end = self._call("cuEventCreate", 0), self._call("cuEventCreate", 0)
            self._call("cuEventRecord", start, gpu.stream)
            for _ in range(launches):
                self._fma(gpu, gpu.iters)
            self._call("cuEventRecord", end, gpu.stream)
            events[i] = (start, end, launches)
        out = {}
        for i, (start, end, launches) in events.items():
            gpu = self.gpus[i]
            self._use(gpu)
            self._call("cuEventSynchronize", end)
            took = float(self._call("cuEventElapsedTime", start, end)) / 1000
            self._call("cuEventDestroy", start)
            self._call("cuEventDestroy", end)
            flops = launches * self._threads(gpu) * ptx.flops_per_thread(gpu.iters)
            out[i] = ComputeRun(flops=float(flops), seconds=took)
        return out

    # ----------------------------------------------------------------- memory

    def _big_buffer(self, gpu: _Gpu, fraction: float) -> tuple[Any, int, int]:
        """The largest buffer up to `fraction` of free memory the driver gives: (pointer, bytes, total bytes)."""
        free, total = self._call("cuMemGetInfo")
        size = int(free * fraction) // 8 * 8
        for _ in range(20):
            try:
                return self._alloc(gpu, size), size, int(total)
            except CudaError:
                size = int(size * 0.95) // 8 * 8  # fragmentation or a neighbour: a little less
        raise CudaError(f"cuMemAlloc: could not allocate {size} bytes for the memory test")

    def memory(self, indices: list[int], fraction: float) -> dict[int, MemoryRun]:
        return {i: self._memory_one(self.gpus[i], fraction) for i in indices}

    def _memory_one(self, gpu: _Gpu, fraction: float) -> MemoryRun:
        self._use(gpu)
        base, size, total = self._big_buffer(gpu, fraction)
        errors = self._alloc(gpu, 16)
        counters = (ctypes.c_uint64 * 2)()
        words, blocks = size // 8, gpu.sms * MEMORY_BLOCKS_PER_SM
        mismatches, bad, seconds = 0, [], 0.0
        try:
            for _name, mask, pattern in ptx.PATTERNS:
                self._call("cuMemsetD32", errors, 0, 4)
                args = tuple(ctypes.c_uint64(v) for v in (int(base), words, mask, pattern))

                def write_and_verify(a: tuple[Any, ...] = args) -> None:
                    self._launch(gpu, "wf_mem_write", blocks, *a)
                    self._launch(gpu, "wf_mem_verify", blocks, *a, ctypes.c_uint64(int(errors)))

                seconds += self._timed(gpu, write_and_verify)
                self._call("cuMemcpyDtoH", ctypes.addressof(counters), errors, 16)
                if counters[0]:
                    mismatches += int(counters[0])
                    bad.append(int(counters[1]) - int(base))  # offset into the tested buffer
        finally:
            self._free(gpu, errors)
            self._free(gpu, base)
        return MemoryRun(bytes_tested=size, bytes_total=total, passes=len(ptx.PATTERNS), mismatches=mismatches,
                         seconds=seconds, bad_addresses=tuple(bad))

    # ----------------------------------------------------------------- copies

    def bandwidth(self, indices: list[int]) -> dict[int, BandwidthRun]:
        return {i: self._bandwidth_one(self.gpus[i], [self.gpus[p] for p in indices if p != i]) for i in indices}

    def _gbps(self, gpu: _Gpu, copy: Callable[[], Any], factor: float = 1.0) -> float:
        def copies() -> None:
            for _ in range(COPY_REPS):
                copy()

        seconds = self._timed(gpu, copies)
        return factor * COPY_BYTES * COPY_REPS / seconds / 1e9

    def _bandwidth_one(self, gpu: _Gpu, peers: list[_Gpu]) -> BandwidthRun:
        self._use(gpu)
        host = self._call("cuMemHostAlloc", COPY_BYTES, 0)
        src, dst = self._alloc(gpu, COPY_BYTES), self._alloc(gpu, COPY_BYTES)
        s = gpu.stream
        try:
            h2d = self._gbps(gpu, lambda: self._call("cuMemcpyHtoDAsync", dst, host, COPY_BYTES, s))
            d2h = self._gbps(gpu, lambda: self._call("cuMemcpyDtoHAsync", host, src, COPY_BYTES, s))
            # Read and write both cross the memory bus: counted twice, as CUDA's bandwidthTest does.
            d2d = self._gbps(gpu, lambda: self._call("cuMemcpyDtoDAsync", dst, src, COPY_BYTES, s), factor=2.0)
            peer = {p.index: self._peer_gbps(gpu, p, src) for p in peers}
        finally:
            self._use(gpu)
            self._free(gpu, src)
            self._free(gpu, dst)
            self._call("cuMemFreeHost", host)
        return BandwidthRun(h2d_gbps=h2d, d2h_gbps=d2h, d2d_gbps=d2d, peer_gbps=peer, peer_link=self.peer_link)

    def _peer_gbps(self, gpu: _Gpu, peer: _Gpu, src: Any) -> float:
        if self._call("cuDeviceCanAccessPeer", gpu.device, peer.device):
            try:
                self._call("cuCtxEnablePeerAccess", peer.ctx, 0)
            except CudaError as exc:
                if "ALREADY_ENABLED" not in str(exc):
                    raise
        self._use(peer)
        dst = self._alloc(peer, COPY_BYTES)
        try:
            self._use(gpu)
            return self._gbps(gpu, lambda: self._call("cuMemcpyPeerAsync", dst, peer.ctx, src, gpu.ctx, COPY_BYTES,
                                                      gpu.stream))
        finally:
            self._use(peer)
            self._free(peer, dst)
            self._use(gpu)

    def close(self) -> None:
        """Free every buffer, unload the kernels, release the primary contexts."""
        for gpu in self.gpus.values():
            self._use(gpu)
            for ptr in list(gpu.buffers):
                self._free(gpu, ptr)
            self._call("cuStreamDestroy", gpu.stream)
            self._call("cuModuleUnload", gpu.module)
            self._call("cuDevicePrimaryCtxRelease", gpu.device)
        self.gpus = {}
