"""The device kernels of the CUDA burn-in, as PTX text the driver compiles itself (no CUDA toolkit on the node).

PTX ISA 7.0 for sm_70 and later: every driver since CUDA 11 JIT-compiles it
for the GPU it runs on (Volta to Hopper and beyond). Kept as generated text so
that tests check it without a GPU.

- `wf_fma(out, iters)`: each thread runs ACCUMULATORS independent FMA chains
  (`a = a * m + c`, bounded, never denormal), UNROLL per loop trip, and stores
  their sum so the compiler cannot drop them. FLOPs = threads * iters * UNROLL * ACCUMULATORS * 2.
- `wf_mem_write(base, words, addr_mask, pattern)` / `wf_mem_verify(..., errors)`:
  grid-stride over 64-bit words; word = (address & addr_mask) ^ pattern, so
  addr_mask = ~0 gives address-in-address (and its inverse with pattern = ~0),
  addr_mask = 0 a constant pattern. Verify counts mismatches into errors[0]
  and keeps one bad address in errors[1].
"""

from __future__ import annotations

ACCUMULATORS = 8
KERNELS = ("wf_fma", "wf_mem_write", "wf_mem_verify")
UNROLL = 16
HEADER = ".version 7.0\n.target sm_70\n.address_size 64\n"
# Patterns of the memory test: (name, addr_mask, pattern).
ALL_ONES = (1 << 64) - 1
PATTERNS: tuple[tuple[str, int, int], ...] = (
    ("address", ALL_ONES, 0),
    ("inverse address", ALL_ONES, ALL_ONES),
    ("0x55", 0, 0x5555555555555555),
    ("0xaa", 0, 0xAAAAAAAAAAAAAAAA),
)


def _f32(value: float) -> str:
    """A PTX hex float literal (0f3F800000 is 1.0)."""
    import struct

    return "0f" + struct.pack(">f", value).hex().upper()


def flops_per_thread(iters: int) -> int:
    """Floating-point operations one thread of `wf_fma` does (an FMA counts two)."""
    return iters * UNROLL * ACCUMULATORS * 2


def fma_kernel() -> str:
    acc = [f"%a{i}" for i in range(ACCUMULATORS)]
    init = "\n".join(f"    add.f32 {a}, %fs, {_f32(float(i + 1))};" for i, a in enumerate(acc))
    body = "\n".join(f"    fma.rn.f32 {a}, {a}, %fm, %fc;" for _ in range(UNROLL) for a in acc)
    total = "\n".join(f"    add.f32 %fs, %fs, {a};" for a in acc)
    return f"""
.visible .entry wf_fma(
    .param .u64 out,
    .param .u32 iters
)
{{
    .reg .pred %p;
    .reg .b32 %r<7>;
    .reg .f32 %a<{ACCUMULATORS}>;
    .reg .f32 %fs;
    .reg .f32 %fm;
    .reg .f32 %fc;
    .reg .b64 %rd<4>;

    mov.u32 %r1, %ctaid.x;
    mov.u32 %r2, %ntid.x;
    mov.u32 %r3, %tid.x;
    mad.lo.u32 %r4, %r1, %r2, %r3;
    cvt.rn.f32.u32 %fs, %r4;
    mul.f32 %fs, %fs, {_f32(1e-6)};
{init}
    mov.f32 %fm, {_f32(0.999999)};
    mov.f32 %fc, {_f32(0.001)};
    ld.param.u32 %r5, [iters];
    mov.u32 %r6, 0;
FMA_LOOP:
{body}
    add.u32 %r6, %r6, 1;
    setp.lt.u32 %p, %r6, %r5;
    @%p bra FMA_LOOP;
    mov.f32 %fs, 0f00000000;
{total}
    ld.param.u64 %rd1, [out];
    cvta.to.global.u64 %rd1, %rd1;
    mul.wide.u32 %rd2, %r4, 4;
    add.u64 %rd3, %rd1, %rd2;
    st.global.f32 [%rd3], %fs;
    ret;
}}
"""


def _grid_stride(name: str, params: str, loads: str, body: str) -> str:
    return f"""
.visible .entry {name}(
{params}
)
{{
    .reg .pred %p;
    .reg .pred %q;
    .reg .b32 %r<5>;
    .reg .b64 %rd<14>;

{loads}
    mov.u32 %r1, %ctaid.x;
    mov.u32 %r2, %ntid.x;
    mov.u32 %r3, %tid.x;
    mov.u32 %r4, %nctaid.x;
    mul.wide.u32 %rd5, %r1, %r2;
    cvt.u64.u32 %rd6, %r3;
    add.u64 %rd5, %rd5, %rd6;
    mul.wide.u32 %rd7, %r4, %r2;
    setp.ge.u64 %p, %rd5, %rd2;
    @%p bra {name}_DONE;
{name}_LOOP:
    shl.b64 %rd8, %rd5, 3;
    add.u64 %rd8, %rd1, %rd8;
    and.b64 %rd9, %rd8, %rd3;
    xor.b64 %rd9, %rd9, %rd4;
{body}
    add.u64 %rd5, %rd5, %rd7;
    setp.lt.u64 %p, %rd5, %rd2;
    @%p bra {name}_LOOP;
{name}_DONE:
    ret;
}}
"""


_PARAMS = "    .param .u64 base,\n    .param .u64 words,\n    .param .u64 addr_mask,\n    .param .u64 pattern"
_LOADS = """    ld.param.u64 %rd1, [base];
    cvta.to.global.u64 %rd1, %rd1;
    ld.param.u64 %rd2, [words];
    ld.param.u64 %rd3, [addr_mask];
    ld.param.u64 %rd4, [pattern];"""


def memory_kernels() -> str:
    write = _grid_stride("wf_mem_write", _PARAMS, _LOADS, "    st.global.u64 [%rd8], %rd9;")
    verify = _grid_stride(
        "wf_mem_verify",
        _PARAMS + ",\n    .param .u64 errors",
        _LOADS + "\n    ld.param.u64 %rd10, [errors];\n    cvta.to.global.u64 %rd10, %rd10;",
        """    ld.global.cg.u64 %rd11, [%rd8];
    setp.ne.u64 %q, %rd11, %rd9;
    @%q atom.global.add.u64 %rd12, [%rd10], 1;
    @%q st.global.u64 [%rd10+8], %rd8;""",
    )
    return write + verify


def module() -> str:
    """The whole PTX module: the compute kernel and the memory test's two."""
    return HEADER + fma_kernel() + memory_kernels()
