"""Time: training from FLOPs at a stated MFU; serving tokens/s bounded by memory bandwidth.

Training FLOPs per token follow PaLM (Chowdhery et al. 2022, appendix B):
6·N + 12·L·H·Q·T, N the weights a token multiplies through, L layers, H·Q the
attention width, T the sequence length. LoRA and QLoRA freeze the base, so its
weight-gradient matmuls (2·N of the 6·N) are skipped: 4·N plus the adapters' 6·n.

A GPU delivers MFU x the reference A100's bf16 dense peak x its `speed` for the
workload class in gpu_models.yaml (a model tempered toward published results,
rather than the raw datasheet ratio), times the fleet's multi-GPU efficiency and
the pipeline bubble.

Serving decode is memory-bound: every step reads the weights (the experts the
step's tokens touch, for MoE) and every sequence's KV cache. Tokens/s is bounded
by that read at peak bandwidth, and by peak bf16 FLOPs; real servers reach less.
"""

from __future__ import annotations

from pydantic import BaseModel

from whaleflux.shared.catalog import GpuModel

from .architectures import ceil_div
from .memory import Split, per_gpu_memory
from .request import DEFAULT_MFU, DTYPE_BYTES, Workload

REFERENCE_GPU = "A100"  # speed 1.0 in gpu_models.yaml
GPUS_PER_NODE = 8  # tensor parallelism stays inside one node
PIPELINE_MICROBATCHES = 8  # per optimizer step; bubble (pp-1)/(m+pp-1)
WORKLOAD_CLASS = {"full": "finetune", "lora": "finetune", "qlora": "finetune", "serve": "inference"}


class Speed(BaseModel):
    tokens_per_s: float
    seconds: float | None = None  # training: the whole run, when dataset tokens are given
    per_sequence_tokens_per_s: float | None = None  # serving: one user's decode rate
    bound: str = ""  # serving: "memory bandwidth" or "compute"
    achieved_tflops_per_gpu: float | None = None
    implied_mfu: float | None = None  # of this GPU's own bf16 dense peak
    efficiency: float = 1.0


def training_flops_per_token(w: Workload) -> dict[str, float]:
    """Model FLOPs per trained token: forward, backward and their sum."""
    a = w.arch
    n = a.matmul_params()
    attention = 4 * a.layers * a.q_dim * w.context  # forward QK^T and AV, per token (PaLM, no causal halving)
    forward = 2 * n + attention
    if w.adapters:
        lora = a.lora_params(w.rank, w.lora_targets)
        backward = 2 * n + 2 * attention + 4 * lora
        forward += 2 * lora
    else:
        backward = 4 * n + 2 * attention
    return {"forward": forward, "backward": backward, "total": forward + backward}


def multi_gpu_factor(gpu: GpuModel, split: Split, efficiency: dict[str, float]) -> float:
    """Interconnect efficiency of gpu_models.yaml, plus the 1F1B pipeline bubble."""
    factor = 1.0
    if split.count > 1:
        factor *= efficiency["nvlink"] if gpu.nvlink_gbps > 0 else efficiency["pcie"]
    if split.count > GPUS_PER_NODE:
        factor *= efficiency["cross_node"]
    if split.pp > 1:
        factor *= PIPELINE_MICROBATCHES / (PIPELINE_MICROBATCHES + split.pp - 1)
    return factor


def mfu(w: Workload) -> float:
    return w.mfu if w.mfu is not None else DEFAULT_MFU[w.task]


def training_speed(w: Workload, gpu: GpuModel, split: Split, reference: GpuModel,
                   efficiency: dict[str, float]) -> Speed:
    per_gpu = mfu(w) * reference.bf16_dense_tflops * 1e12 * gpu.speed[WORKLOAD_CLASS[w.task]]
    eff = multi_gpu_factor(gpu, split, efficiency)
    tokens_per_s = split.count * per_gpu * eff / training_flops_per_token(w)["total"]
    seconds = w.dataset_tokens * w.epochs / tokens_per_s if w.dataset_tokens else None
    return Speed(
        tokens_per_s=tokens_per_s,
        seconds=seconds,
        achieved_tflops_per_gpu=per_gpu / 1e12,
        implied_mfu=per_gpu / (gpu.bf16_dense_tflops * 1e12),
        efficiency=eff,
    )


def experts_touched(experts: int, per_token: int, tokens: int) -> float:
    """Expected distinct experts `tokens` tokens route to, if routing is uniform."""
    return experts * (1 - (1 - per_token / experts) ** tokens)


def serving_speed(w: Workload, gpu: GpuModel, split: Split) -> Speed:
    """Decode tokens/s bound for `batch` sequences at full context."""
    a = w.arch
    breakdown = per_gpu_memory(w, split)
    mem = {i.key: i.bytes for i in breakdown.items}
    weights: float = mem["weights"]
    if breakdown.stage == "first" or (breakdown.stage == "all" and not a.tied_embeddings):
        # The embedding is a lookup of a few rows, not a read of the matrix.
        weights -= a.embedding_params() * (4 if w.weight_dtype == "fp32" else 2) / split.tp
    if a.is_moe:
        # Expert matrices are read only for the experts this micro-batch's tokens use.
        micro = ceil_div(w.batch, split.pp)
        layers = ceil_div(a.layers, split.pp)
        per_expert = layers * a.expert_weights() * DTYPE_BYTES[w.weight_dtype] / split.tp
        unused = a.experts - experts_touched(a.experts, a.experts_per_token, micro)
        weights -= unused * per_expert
    # Each of the pp micro-batches of a pipelined step reads the stage's weights again.
    bytes_per_step = split.pp * weights + mem["kv_cache"]
    t_memory = bytes_per_step / (gpu.memory_bandwidth_tbps * 1e12)
    flops = w.batch * (2 * a.matmul_params() + 4 * a.layers * a.q_dim * w.context)
    t_compute = flops / split.count / (gpu.bf16_dense_tflops * 1e12)
    step = max(t_memory, t_compute)
    tokens_per_s = w.batch / step
    return Speed(
        tokens_per_s=tokens_per_s,
        per_sequence_tokens_per_s=tokens_per_s / w.batch,
        bound="memory bandwidth" if t_memory >= t_compute else "compute",
    )
