"""A stand-in for `cuda.bindings.driver` with the calls the CUDA burn-in makes, so that its plumbing (ctypes kernel
parameters, buffer handling, event timing, error naming) is tested without a GPU, as fake_nvml.py does for NVML.

Device memory is host memory, given only to buffers a kernel touches; the three kernels are done in Python by
their PTX meaning (ptx.py); time is virtual: each launch or copy takes what a modelled GPU would need.
"""

from __future__ import annotations

import ctypes
import enum
from array import array
from dataclasses import dataclass, field

MASK = (1 << 64) - 1


class CUresult(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1
    CUDA_ERROR_OUT_OF_MEMORY = 2
    CUDA_ERROR_NOT_FOUND = 500


class CUdevice_attribute(enum.IntEnum):  # noqa: N801  (as cuda-bindings names it)
    CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16


@dataclass
class Buffer:
    device: int
    size: int
    words: array | None = None  # backing, created when a kernel first touches it


@dataclass
class Event:
    t: float = 0.0


@dataclass
class FakeCuda:
    bus_ids: list[str]
    free: int = 1024 * 1024
    sms: int = 2
    fma_flops_per_s: float = 50e12
    memory_bytes_per_s: float = 3e12
    pcie_bytes_per_s: float = 50e9
    peer_bytes_per_s: float = 400e9
    flip: dict[int, int] = field(default_factory=dict)  # device -> word offset whose bit 0 flips after a write
    refuse: set[str] = field(default_factory=set)  # calls that fail with CUDA_ERROR_NOT_FOUND
    CUresult = CUresult
    CUdevice_attribute = CUdevice_attribute

    def __post_init__(self) -> None:
        self.buffers: dict[int, Buffer] = {}
        self.host: dict[int, ctypes.Array] = {}
        self.next_address = 0x7F00_0000_0000
        self.clock = 0.0
        self.current = -1
        self.loaded: list[str] = []
        self.launches: list[tuple[str, int, int, tuple[int, ...]]] = []

    def __getattribute__(self, name: str):
        refuse = object.__getattribute__(self, "refuse")
        if name in refuse:
            return lambda *a: (CUresult.CUDA_ERROR_NOT_FOUND,)
        return object.__getattribute__(self, name)

    # ------------------------------------------------------------------ devices, contexts, modules

    def cuInit(self, flags):  # noqa: N802  (the driver API's names)
        return (CUresult.CUDA_SUCCESS,)

    def cuGetErrorName(self, err):  # noqa: N802
        return CUresult.CUDA_SUCCESS, CUresult(err).name.encode()

    def cuDeviceGetByPCIBusId(self, bus: bytes):  # noqa: N802
        wanted = bus.decode().upper()
        if wanted not in self.bus_ids:
            return CUresult.CUDA_ERROR_INVALID_VALUE, None
        return CUresult.CUDA_SUCCESS, self.bus_ids.index(wanted)

    def cuDeviceGet(self, ordinal):  # noqa: N802
        return CUresult.CUDA_SUCCESS, ordinal

    def cuDevicePrimaryCtxRetain(self, device):  # noqa: N802
        return CUresult.CUDA_SUCCESS, ("ctx", device)

    def cuCtxSetCurrent(self, ctx):  # noqa: N802
        self.current = ctx[1]
        return (CUresult.CUDA_SUCCESS,)

    def cuModuleLoadData(self, address):  # noqa: N802
        self.loaded.append(ctypes.string_at(address).decode())
        return CUresult.CUDA_SUCCESS, ("module", self.current)

    def cuModuleGetFunction(self, module, name: bytes):  # noqa: N802
        if f".entry {name.decode()}(" not in self.loaded[-1]:
            return CUresult.CUDA_ERROR_NOT_FOUND, None
        return CUresult.CUDA_SUCCESS, name.decode()

    def cuDeviceGetAttribute(self, attribute, device):  # noqa: N802
        return CUresult.CUDA_SUCCESS, self.sms

    def cuStreamCreate(self, flags):  # noqa: N802
        return CUresult.CUDA_SUCCESS, ("stream", self.current)

    def cuStreamDestroy(self, stream):  # noqa: N802
        return (CUresult.CUDA_SUCCESS,)

    def cuModuleUnload(self, module):  # noqa: N802
        return (CUresult.CUDA_SUCCESS,)

    def cuDevicePrimaryCtxRelease(self, device):  # noqa: N802
        return (CUresult.CUDA_SUCCESS,)

    def cuDeviceCanAccessPeer(self, device, peer):  # noqa: N802
        return CUresult.CUDA_SUCCESS, 1

    def cuCtxEnablePeerAccess(self, ctx, flags):  # noqa: N802
        return (CUresult.CUDA_SUCCESS,)

    # ------------------------------------------------------------------ memory

    def cuMemGetInfo(self):  # noqa: N802
        used = sum(b.size for b in self.buffers.values() if b.device == self.current and b.size < self.free)
        return CUresult.CUDA_SUCCESS, self.free - used, 2 * self.free

    def cuMemAlloc(self, size):  # noqa: N802
        address = self.next_address
        self.next_address += (size + 0xFFFF) & ~0xFFFF
        self.buffers[address] = Buffer(self.current, size)
        return CUresult.CUDA_SUCCESS, address

    def cuMemFree(self, address):  # noqa: N802
        del self.buffers[int(address)]
        return (CUresult.CUDA_SUCCESS,)

    def cuMemHostAlloc(self, size, flags):  # noqa: N802
        buffer = ctypes.create_string_buffer(16)  # never read: copies only take time here
        self.host[ctypes.addressof(buffer)] = buffer
        return CUresult.CUDA_SUCCESS, ctypes.addressof(buffer)

    def cuMemFreeHost(self, address):  # noqa: N802
        del self.host[address]
        return (CUresult.CUDA_SUCCESS,)

    def _words(self, address: int, count: int) -> array:
        buffer = self.buffers[address]
        if buffer.words is None:
            buffer.words = array("Q", bytes(8 * count))
        return buffer.words

    def cuMemsetD32(self, address, value, count):  # noqa: N802
        self.buffers[int(address)].words = array("Q", bytes(4 * count))
        return (CUresult.CUDA_SUCCESS,)

    def cuMemcpyDtoH(self, host, address, size):  # noqa: N802
        data = self.buffers[int(address)].words
        ctypes.memmove(host, (data or array("Q", bytes(size))).tobytes()[:size], size)
        return (CUresult.CUDA_SUCCESS,)

    def _copy(self, size: int, rate: float):
        self.clock += size / rate
        return (CUresult.CUDA_SUCCESS,)

    def cuMemcpyHtoDAsync(self, dst, src, size, stream):  # noqa: N802
        return self._copy(size, self.pcie_bytes_per_s)

    def cuMemcpyDtoHAsync(self, dst, src, size, stream):  # noqa: N802
        return self._copy(size, self.pcie_bytes_per_s)

    def cuMemcpyDtoDAsync(self, dst, src, size, stream):  # noqa: N802
        return self._copy(2 * size, self.memory_bytes_per_s)

    def cuMemcpyPeerAsync(self, dst, dst_ctx, src, src_ctx, size, stream):  # noqa: N802
        return self._copy(size, self.peer_bytes_per_s)

    # ------------------------------------------------------------------ events and kernels

    def cuEventCreate(self, flags):  # noqa: N802
        return CUresult.CUDA_SUCCESS, Event()

    def cuEventRecord(self, event, stream):  # noqa: N802
        event.t = self.clock
        return (CUresult.CUDA_SUCCESS,)

    def cuEventSynchronize(self, event):  # noqa: N802
        return (CUresult.CUDA_SUCCESS,)

    def cuEventElapsedTime(self, start, end):  # noqa: N802
        return CUresult.CUDA_SUCCESS, (end.t - start.t) * 1000

    def cuEventDestroy(self, event):  # noqa: N802
        return (CUresult.CUDA_SUCCESS,)

    def cuLaunchKernel(self, fn, gx, gy, gz, bx, by, bz, shared, stream, params, extra):  # noqa: N802
        count = {"wf_fma": 2, "wf_mem_write": 4, "wf_mem_verify": 5}[fn]
        pointers = (ctypes.c_void_p * count).from_address(params)
        kinds = [ctypes.c_uint64, ctypes.c_uint32] if fn == "wf_fma" else [ctypes.c_uint64] * count
        values = tuple(kind.from_address(p).value for kind, p in zip(kinds, pointers, strict=True))
        self.launches.append((fn, gx, bx, values))
        if fn == "wf_fma":
            from whaleflux.agent.burnin.ptx import flops_per_thread

            self.clock += gx * bx * flops_per_thread(values[1]) / self.fma_flops_per_s
            return (CUresult.CUDA_SUCCESS,)
        base, words, mask, pattern = values[:4]
        data = self._words(base, words)
        self.clock += 8 * words / self.memory_bytes_per_s
        if fn == "wf_mem_write":
            for i in range(words):
                data[i] = ((base + 8 * i) & mask) ^ pattern
            if self.current in self.flip:
                data[self.flip[self.current]] ^= 1
        else:
            bad = [i for i in range(words) if data[i] != ((base + 8 * i) & mask) ^ pattern]
            errors = self._words(values[4], 2)
            errors[0] += len(bad)
            if bad:
                errors[1] = base + 8 * bad[-1]
        return (CUresult.CUDA_SUCCESS,)
