"""Memory line items per GPU: weights, KV cache, activations, adapters, gradients, optimizer, overhead.

Splits: tensor parallel (tp) divides every layer's matrices, its activations
(with sequence parallelism) and its KV heads; pipeline parallel (pp) gives each
GPU a contiguous run of layers, the first stage also the embedding and the last
the LM head; data parallel (dp, training only) shards weights, gradients and
optimizer states ZeRO-3/FSDP style while each replica keeps its own activations.
Pipelines run a 1F1B schedule: the first stage holds activations of pp
micro-batches, the last of one. A split reports its heaviest stage.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import BaseModel

from .architectures import ceil_div
from .request import DTYPE_BYTES, Workload

GiB = 1024**3
CUDA_CONTEXT_BYTES = 1 * GiB  # CUDA context, cuBLAS/cuDNN workspaces
NCCL_BYTES = GiB // 2  # NCCL communicator buffers, multi-GPU only
FRAGMENTATION = 0.05  # caching-allocator fragmentation and short-lived buffers
PREFILL_CHUNK_TOKENS = 8192  # serving: tokens one prefill step processes (chunked prefill)
ADAPTER_BYTES = {"peft": 4, "unsloth": 2}  # PEFT keeps LoRA weights fp32 under bf16 autocast; Unsloth bf16
OPTIMIZER_STATE_BYTES = {"adamw": 8, "adamw-8bit": 2, "sgd": 4}  # per trained parameter
OPTIMIZER_NOTES = {
    "adamw": "Adam m and v, fp32",
    "adamw-8bit": "Adam m and v, 8-bit (bitsandbytes)",
    "sgd": "SGD momentum, fp32",
}


@dataclass(frozen=True)
class Split:
    tp: int = 1
    pp: int = 1
    dp: int = 1  # training: data-parallel replicas sharding states (ZeRO-3/FSDP)

    @property
    def count(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def label(self) -> str:
        parts = [f"tp{self.tp}" if self.tp > 1 else "", f"pp{self.pp}" if self.pp > 1 else "",
                 f"fsdp{self.dp}" if self.dp > 1 else ""]
        return " ".join(p for p in parts if p) or "single"


class MemoryItem(BaseModel):
    key: str
    label: str
    bytes: int
    counted: bool = True
    note: str = ""


class MemoryBreakdown(BaseModel):
    stage: str  # "all" (no pipeline), "first" or "last" pipeline stage
    items: list[MemoryItem]
    total_bytes: int


def activation_elements_per_token(w: Workload) -> int:
    """Values one layer keeps per token for its backward pass (bf16 autocast, flash attention).

    Attention: norm input and output, q, k, v, attention output. Gated MLP: norm
    input and output, gate, act(gate), up and their product; an MoE layer
    dispatches a copy of the input to each of its k experts.
    """
    a = w.arch
    attention = 2 * a.hidden + 2 * a.q_dim + 2 * a.kv_dim
    if a.is_moe:
        mlp = 2 * a.hidden + a.experts + a.experts_per_token * (a.hidden + 4 * a.expert_intermediate)
        mlp += 4 * a.shared_expert_intermediate
    else:
        mlp = 2 * a.hidden + 4 * a.intermediate
    return attention + mlp


def _param_split(w: Workload, split: Split, stage: str) -> tuple[float, float, int]:
    """(quantizable matrix params, 16-bit params, layers) one GPU of this stage holds."""
    a = w.arch
    layers = ceil_div(a.layers, split.pp)
    if stage == "all":
        edge = a.embedding_params() + a.lm_head_params() + a.hidden
    elif stage == "first":
        edge = a.embedding_params()
    else:  # the last stage needs its own head matrix even when tied to the embedding
        edge = a.vocab * a.hidden + a.hidden
    linear = layers * a.layer_linear() / split.tp
    other = (layers * a.layer_other() + edge) / split.tp
    return linear, other, layers


def stage_memory(w: Workload, split: Split, stage: str = "all") -> MemoryBreakdown:
    """Memory one GPU of `stage` needs under `split`."""
    linear, other, layers = _param_split(w, split, stage)
    gpu = _StageMemory(w, split, layers, in_flight=split.pp if stage == "first" else 1,
                       has_head=stage in ("all", "last"), shard=split.dp if w.training else 1)
    quant_note = ("" if gpu.wbytes >= 2 else
                  f"matrices {w.weight_dtype} ({gpu.wbytes * 8:.3g} bits incl. scales), embeddings/head/norms bf16")
    weights = (linear * gpu.wbytes + other * gpu.keep) / gpu.shard
    gpu.add("weights", f"weights ({w.weight_dtype})", weights, quant_note)
    if w.task == "serve":
        gpu.add_serving()
    else:
        gpu.add_activations()
        gpu.add_training_state(linear + other)
    base = sum(i.bytes for i in gpu.items if i.counted)
    nccl = NCCL_BYTES if split.count > 1 else 0
    gpu.add("overhead", "framework/CUDA overhead", CUDA_CONTEXT_BYTES + nccl + FRAGMENTATION * base,
            f"CUDA context and workspaces 1 GiB{', NCCL 0.5 GiB' if nccl else ''}, "
            f"{FRAGMENTATION:.0%} allocator fragmentation")
    total = sum(i.bytes for i in gpu.items if i.counted)
    return MemoryBreakdown(stage=stage, items=gpu.items, total_bytes=total)


@dataclass
class _StageMemory:
    """The items of one GPU's memory as they are added, and what each item's size depends on."""

    w: Workload
    split: Split
    layers: int  # of this stage
    in_flight: int  # micro-batches whose activations the stage holds at once
    has_head: bool
    shard: int  # FSDP's split of weights and training state
    items: list[MemoryItem] = field(default_factory=list)

    @property
    def wbytes(self) -> float:
        return DTYPE_BYTES[self.w.weight_dtype]

    @property
    def keep(self) -> float:
        """Bytes per value of what stays 16-bit (embeddings, head, norms, biases), or fp32."""
        return 4.0 if self.w.weight_dtype == "fp32" else 2.0

    def add(self, key: str, label: str, value: float, note: str = "", counted: bool = True) -> None:
        self.items.append(MemoryItem(key=key, label=label, bytes=round(value), counted=counted, note=note))

    def add_serving(self) -> None:
        """The KV cache of every sequence at full context, and one prefill chunk's activations."""
        w, a, split, layers = self.w, self.w.arch, self.split, self.layers
        kv_heads = ceil_div(a.kv_heads, split.tp)  # tp beyond the KV heads replicates them
        kv_bytes = DTYPE_BYTES[w.kv_cache_dtype]
        per_token = 2 * layers * kv_heads * a.head_dim * kv_bytes
        note = (f"2 x {layers} layers x {kv_heads} KV heads x {a.head_dim} x {kv_bytes:g} B = "
                f"{per_token / 1024:g} KiB/token x {w.context} tokens x {w.batch} sequences")
        tokens = a.kv_tokens(layers, w.context)
        if a.sliding_window and w.context > a.sliding_window:
            sliding = layers * a.sliding_layers / a.layers
            note = (f"2 x {kv_heads} KV heads x {a.head_dim} x {kv_bytes:g} B x ({layers - sliding:g} global layers "
                    f"x {w.context} tokens + {sliding:g} sliding-window layers x {a.sliding_window} tokens) x "
                    f"{w.batch} sequences")
        self.add("kv_cache", f"KV cache ({w.kv_cache_dtype})",
                 2 * kv_heads * a.head_dim * kv_bytes * tokens * w.batch, note)
        chunk = min(PREFILL_CHUNK_TOKENS, w.context * w.batch)
        prefill = activation_elements_per_token(w) * chunk * 2 / split.tp
        logits = w.batch * a.vocab * 4 / split.tp if self.has_head else 0
        self.add("activations", "activations (prefill)", prefill + logits,
                 f"one layer's tensors for a {chunk}-token prefill chunk, fp32 logits of {w.batch} sequences")

    def add_activations(self) -> None:
        """Training: activations with and without checkpointing (one of them counted), and the logits."""
        w, a, split, layers, in_flight = self.w, self.w.arch, self.split, self.layers, self.in_flight
        act_bytes = 4 if w.weight_dtype == "fp32" else 2
        tokens = w.context * w.batch
        full_layer = activation_elements_per_token(w) * tokens * act_bytes / split.tp
        layer_input = a.hidden * tokens * act_bytes / split.tp
        batches = f"{in_flight} micro-batch{'es' if in_flight > 1 else ''}"
        where = f"{layers} layers x {batches} of {w.batch} x {w.context} tokens"
        if w.stack == "unsloth":  # its checkpoints go to CPU RAM: the GPU holds the one being used and the next
            with_ckpt = 2 * layer_input + full_layer
            how = f"layer inputs of {where} offloaded to CPU RAM (two on the GPU), plus one layer recomputed"
        else:
            with_ckpt = layer_input * layers * in_flight + full_layer
            how = f"layer inputs of {where}, plus one layer recomputed"
        without = full_layer * layers * in_flight
        self.add("activations_checkpointed", "activations, with checkpointing", with_ckpt, how,
                 counted=w.checkpointing)
        self.add("activations_full", "activations, without checkpointing", without, where,
                 counted=not w.checkpointing)
        if self.has_head:
            if w.stack == "unsloth":
                self.add("logits", "logits and loss", tokens * a.vocab * act_bytes / split.tp,
                         f"{tokens} tokens x {a.vocab} vocab, {act_bytes} B logits; fused cross-entropy, no fp32 copy")
            else:
                self.add("logits", "logits and loss", tokens * a.vocab * (act_bytes + 4) / split.tp,
                         f"{tokens} tokens x {a.vocab} vocab, {act_bytes} B logits + fp32 copy for the loss")

    def add_training_state(self, params: float) -> None:
        """Gradients and optimizer states (of the adapters, or of every weight), and FSDP's gathered layers."""
        w, a, split, shard = self.w, self.w.arch, self.split, self.shard
        opt = OPTIMIZER_STATE_BYTES[w.optimizer_name]
        if w.adapters:
            n = a.lora_params(w.rank, w.lora_targets) * self.layers / a.layers / split.tp / shard
            targets = ",".join(w.lora_targets)
            adapter = ADAPTER_BYTES[w.stack]
            kind = "fp32" if adapter == 4 else "bf16"
            self.add("lora_weights", "LoRA adapter weights", n * adapter, f"rank {w.rank} on {targets}, {kind}")
            self.add("lora_gradients", "LoRA adapter gradients", n * adapter, kind)
            self.add("lora_optimizer", "LoRA adapter optimizer states", n * opt, OPTIMIZER_NOTES[w.optimizer_name])
        else:
            n = params / shard
            grad = 4 if w.weight_dtype == "fp32" else 2
            master = 0 if w.weight_dtype == "fp32" else 4
            self.add("gradients", f"gradients ({'fp32' if grad == 4 else 'bf16'})", n * grad)
            note = OPTIMIZER_NOTES[w.optimizer_name] + (" + fp32 master weights" if master else "")
            self.add("optimizer", "optimizer states", n * (opt + master), note)
        if shard > 1:
            # FSDP gathers one layer's full weights to compute it, and prefetches the next.
            layer_bytes = a.layer_linear() * self.wbytes + a.layer_other() * self.keep
            self.add("fsdp_buffers", "FSDP gathered layers", 2 * layer_bytes / split.tp,
                     "two unsharded layers (current + prefetch)")


def per_gpu_memory(w: Workload, split: Split) -> MemoryBreakdown:
    """The heaviest GPU's memory under `split` (the first or last pipeline stage)."""
    if split.pp == 1:
        return stage_memory(w, split, "all")
    return max((stage_memory(w, split, s) for s in ("first", "last")), key=lambda b: b.total_bytes)
