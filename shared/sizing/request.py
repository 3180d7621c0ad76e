"""What a sizing question asks, and its checked, defaulted form."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from .architectures import CATALOGUE, LORA_MODULES, Architecture, from_hf_config, resolve_model
from .errors import SizingError

T = TypeVar("T")

Task = Literal["serve", "full", "lora", "qlora"]
Dtype = Literal["fp32", "bf16", "fp16", "fp8", "int8", "int4", "nf4"]
Optimizer = Literal["adamw", "adamw-8bit", "sgd"]
TrainingStack = Literal["peft", "unsloth"]

TRAINING: set[str] = {"full", "lora", "qlora"}

# Bytes per stored value. 4-bit formats carry their scales: int4 (GPTQ/AWQ, group
# 128, fp16 scale and zero point) 4.25 bits; nf4 (bitsandbytes, block 64 with
# double-quantized absmax) 4.127 bits, as in the QLoRA paper.
DTYPE_BYTES: dict[str, float] = {
    "fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 4.25 / 8, "nf4": 4.127 / 8,
}
DEFAULT_WEIGHTS: dict[str, str] = {"serve": "bf16", "full": "bf16", "lora": "bf16", "qlora": "nf4"}
# Model FLOPs utilization on the reference GPU (A100, speed 1.0): typical of
# well-tuned PyTorch fine-tuning; QLoRA lower for dequantizing every weight per matmul.
DEFAULT_MFU: dict[str, float] = {"full": 0.40, "lora": 0.40, "qlora": 0.30}
# The share of each GPU's memory a serving stack may use: vLLM preallocates gpu_memory_utilization (0.9 by
# default) of the GPU for weights, activations and its KV cache blocks.
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
STACKS = {
    "vllm": "vLLM (gpu_memory_utilization of each GPU)",
    "pytorch": "PyTorch mixed precision (all of each GPU's memory)",
    "peft": "Hugging Face PEFT + bitsandbytes: fp32 adapters, their gradients and optimizer states, bf16 logits "
            "plus the fp32 copy the loss makes, checkpointed layer inputs on the GPU",
    "unsloth": "Unsloth (fused kernels): bf16 adapters and gradients, 8-bit AdamW unless another optimizer is "
               "given, checkpointed layer inputs offloaded to CPU RAM, fused chunked cross-entropy (bf16 logits, "
               "no fp32 copy)",
}
HF_MODULE_NAMES = {"q_proj": "q", "k_proj": "k", "v_proj": "v", "o_proj": "o", "gate_proj": "gate",
                   "up_proj": "up", "down_proj": "down", "w1": "gate", "w3": "up", "w2": "down"}


class SizingRequest(BaseModel):
    """One sizing question: a model (catalogue name or config.json contents) and a workload."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(None, description="catalogue model, e.g. llama-3-70b (or give `config`)")
    config: dict[str, Any] | None = Field(None, description="contents of a Hugging Face config.json instead of `model`")
    config_name: str | None = Field(None, max_length=200, description="label for `config` in the report")
    task: Task = Field("serve", description="serve, full (fine-tune), lora or qlora")
    context: int = Field(4096, ge=1, le=10_000_000, description="tokens per sequence")
    batch: int = Field(1, ge=1, le=100_000,
                       description="serve: concurrent sequences; training: micro-batch per replica")
    weight_dtype: Dtype | None = Field(None, description="default bf16; nf4 for qlora")
    kv_dtype: Dtype | None = Field(None, description="KV cache dtype (serve only); default bf16")
    dataset_tokens: int | None = Field(None, ge=1, description="training tokens per epoch")
    epochs: float | None = Field(None, gt=0, le=1000)
    lora_rank: int | None = Field(None, ge=1, le=4096)
    lora_targets: list[str] | None = Field(None, description="of q,k,v,o,gate,up,down; default all")
    optimizer: Optimizer | None = Field(None, description="training: adamw (default), adamw-8bit, sgd")
    checkpointing: bool | None = Field(None, description="training: activation checkpointing (default on)")
    mfu: float | None = Field(None, gt=0, le=1, description="training: model FLOPs utilization on an A100")
    gpu_memory_utilization: float | None = Field(
        None, gt=0, le=1, description="serve: the share of each GPU's memory the serving stack may use (vLLM's "
                                      "gpu_memory_utilization; default 0.9)")
    training_stack: TrainingStack | None = Field(
        None, description="lora/qlora: peft (Hugging Face PEFT + bitsandbytes, default) or unsloth (fused kernels)")
    gpus: list[str] = Field(default_factory=list, description="GPU models to consider; empty means all")
    max_gpus: int = Field(64, ge=1, le=1024)
    prices: dict[str, float] = Field(default_factory=dict, description="USD per GPU-hour overrides by GPU model")


@dataclass(frozen=True)
class Workload:
    """A request with its model resolved, defaults filled in and combinations checked."""

    arch: Architecture
    task: str
    context: int
    batch: int
    weight_dtype: str
    kv_dtype: str | None
    dataset_tokens: int | None
    epochs: float
    lora_rank: int | None
    lora_targets: tuple[str, ...]
    optimizer: str | None
    checkpointing: bool
    mfu: float | None
    stack: str = "vllm"  # a key of STACKS
    memory_budget: float = DEFAULT_GPU_MEMORY_UTILIZATION  # share of each GPU's memory a configuration may use

    @property
    def training(self) -> bool:
        return self.task in TRAINING

    @property
    def adapters(self) -> bool:
        return self.task in ("lora", "qlora")

    # The settings of one kind of task, set (by `resolve`) exactly when the task has them.
    @property
    def kv_cache_dtype(self) -> str:
        """Serving: the KV cache's dtype."""
        return _set(self.kv_dtype, "kv_dtype", self.task)

    @property
    def optimizer_name(self) -> str:
        """Training: the optimizer."""
        return _set(self.optimizer, "optimizer", self.task)

    @property
    def rank(self) -> int:
        """LoRA/QLoRA: the adapters' rank."""
        return _set(self.lora_rank, "lora_rank", self.task)


def _set(value: T | None, field: str, task: str) -> T:
    if value is None:
        raise SizingError(field, f"does not apply to task {task!r}")
    return value


def _forbid(req: SizingRequest, task: str, fields: tuple[str, ...], why: str) -> None:
    for f in fields:
        if getattr(req, f) is not None:
            raise SizingError(f, f"does not apply to task {task!r} ({why})")


def resolve(req: SizingRequest) -> Workload:
    """Resolve the model, fill task defaults, refuse impossible combinations."""
    if (req.model is None) == (req.config is None):
        raise SizingError("model", "give exactly one of `model` (a catalogue name) or `config` (config.json contents)")
    if req.model is not None:
        arch = resolve_model(req.model)
    else:
        arch = from_hf_config(req.config, name=req.config_name or "config.json")
    task = req.task
    if req.context > arch.max_context:
        longer = [a.name for a in _same_shape(arch) if a.max_context >= req.context]
        hint = f"; {', '.join(longer)} supports it" if longer else ""
        raise SizingError(
            "context",
            f"{req.context} tokens is longer than {arch.name} supports ({arch.max_context}, "
            f"max_position_embeddings){hint}",
        )
    weights = _weight_dtype(req)
    _forbid_others(req)
    kv = (req.kv_dtype or "bf16") if task == "serve" else None
    if kv == "nf4":
        raise SizingError("kv_dtype", "nf4 is a weight format; for a 4-bit KV cache use int4")
    stack = "vllm" if task == "serve" else "pytorch" if task == "full" else (req.training_stack or "peft")
    default_optimizer = "adamw-8bit" if stack == "unsloth" else "adamw"
    return Workload(
        arch=arch,
        task=task,
        context=req.context,
        batch=req.batch,
        weight_dtype=weights,
        kv_dtype=kv,
        dataset_tokens=req.dataset_tokens,
        epochs=req.epochs or 1.0,
        lora_rank=(req.lora_rank or 16) if task in ("lora", "qlora") else None,
        lora_targets=_lora_targets(req) if task in ("lora", "qlora") else (),
        optimizer=(req.optimizer or default_optimizer) if task != "serve" else None,
        checkpointing=req.checkpointing if req.checkpointing is not None else task != "serve",
        mfu=req.mfu,
        stack=stack,
        memory_budget=(req.gpu_memory_utilization or DEFAULT_GPU_MEMORY_UTILIZATION) if task == "serve" else 1.0,
    )


def _weight_dtype(req: SizingRequest) -> str:
    """The weights' dtype: given or the task's default, and one the task can train."""
    task = req.task
    weights = req.weight_dtype or DEFAULT_WEIGHTS[task]
    if task == "full" and weights not in ("fp32", "bf16", "fp16"):
        raise SizingError("weight_dtype", f"a full fine-tune trains every weight, which cannot be {weights}; "
                                          "use fp32/bf16, or task qlora")
    if task == "qlora" and weights not in ("nf4", "int4"):
        raise SizingError(
            "weight_dtype", f"qlora trains adapters on a 4-bit base (nf4/int4), not {weights}; use task lora")
    if task == "lora" and weights in ("nf4", "int4"):
        raise SizingError("weight_dtype", "LoRA on a 4-bit base is task qlora")
    return weights


def _forbid_others(req: SizingRequest) -> None:
    """Refuse the settings of another kind of task."""
    task = req.task
    if task == "serve":
        _forbid(req, task, ("dataset_tokens", "epochs", "optimizer", "checkpointing", "mfu"), "training only")
        _forbid(req, task, ("lora_rank", "lora_targets", "training_stack"), "lora/qlora only")
    else:
        _forbid(req, task, ("kv_dtype",), "serving only: training keeps no KV cache")
        _forbid(req, task, ("gpu_memory_utilization",), "serving only: a serving stack's memory budget")
        if task == "full":
            _forbid(req, task, ("lora_rank", "lora_targets", "training_stack"), "lora/qlora only")


def _lora_targets(req: SizingRequest) -> tuple[str, ...]:
    """The adapters' modules in the estimator's names (Hugging Face names accepted), each once."""
    resolved: list[str] = []
    for n in req.lora_targets or list(LORA_MODULES):
        key = HF_MODULE_NAMES.get(n, n)
        if key not in LORA_MODULES:
            raise SizingError("lora_targets", f"unknown module {n!r}; choose from {', '.join(LORA_MODULES)}")
        if key not in resolved:
            resolved.append(key)
    if not resolved:
        raise SizingError("lora_targets", "name at least one module")
    return tuple(resolved)


def _same_shape(arch: Architecture) -> list[Architecture]:
    """Catalogue models with the same architecture (e.g. Llama 3 and 3.1 70B)."""
    key = arch.model_dump(exclude={"name", "source", "max_context", "notes"})
    return [a for a in CATALOGUE.values() if a.model_dump(exclude={"name", "source", "max_context", "notes"}) == key]
