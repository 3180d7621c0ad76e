"""Every feasible (GPU model, count, split), ranked by cost and by time.

GPU models and their memory, bandwidth and speed come from gpu_models.yaml.
Costs use reference on-demand cloud prices from prices-reference.csv (the same
offers billing's reference rates use) until billing's price book replaces them;
a caller may pass its own prices.
"""

from __future__ import annotations

import csv
from functools import lru_cache
from typing import Any

from pydantic import BaseModel

from whaleflux.shared.catalog import GpuModel, gpu_models, model_key, multi_gpu_efficiency
from whaleflux.shared.datafiles import DATA_DIR

from .errors import SizingError
from .memory import GiB, MemoryItem, Split, per_gpu_memory, stage_memory
from .request import STACKS, SizingRequest, Workload, resolve
from .throughput import (
    GPUS_PER_NODE,
    PIPELINE_MICROBATCHES,
    REFERENCE_GPU,
    WORKLOAD_CLASS,
    Speed,
    mfu,
    serving_speed,
    training_flops_per_token,
    training_speed,
)

MiB = 1024**2
PRICES_FILE = DATA_DIR / "prices-reference.csv"
# GPU model -> (gpu, provider, offer) row of prices-reference.csv: on-demand list
# prices, the same rows as billing's reference rates.
REFERENCE_OFFERS: dict[str, tuple[str, str, str]] = {
    "H100": ("H100 SXM 80GB", "AWS", "p5.48xlarge on-demand"),
    "H200": ("H200 141GB", "AWS", "p5en.48xlarge on-demand"),
    "A100": ("A100 SXM 80GB", "AWS", "p4de.24xlarge on-demand"),
    "RTX4090": ("RTX 4090 24GB", "OpenRelay", "on-demand"),
}
TASK_NAMES = {"serve": "Serving", "full": "Full fine-tune", "lora": "LoRA", "qlora": "QLoRA"}


class Price(BaseModel):
    usd_per_gpu_hour: float
    source: str
    as_of: str = ""
    reference: bool = True  # a reference list price, not what this fleet pays


class Option(BaseModel):
    gpu: str
    count: int
    split: str
    tp: int
    pp: int
    dp: int
    per_gpu_bytes: int
    capacity_bytes: int
    budget_bytes: int  # the share of capacity the stack may use (vLLM: gpu_memory_utilization); fits within it
    stage: str
    memory_bytes: dict[str, int]  # the counted line items of the heaviest GPU
    tokens_per_s: float
    seconds: float | None = None
    per_sequence_tokens_per_s: float | None = None
    bound: str = ""
    implied_mfu: float | None = None
    efficiency: float = 1.0
    usd_per_hour: float | None = None
    usd_per_million_tokens: float | None = None
    cost_usd: float | None = None
    best_split: bool = False  # the fastest split for this GPU model and count
    times_slower: float = 1.0  # than the fastest option
    cost_rank: int = 0
    time_rank: int = 0


class SizingReport(BaseModel):
    summary: str
    model: dict[str, Any]
    workload: dict[str, Any]
    memory: list[MemoryItem]  # the whole workload on one GPU, before any split
    memory_total_bytes: int
    flops_per_token: dict[str, float] | None = None
    options: list[Option]  # every feasible (GPU model, count, split), cheapest first
    per_gpu_model: list[str]
    prices: dict[str, Price]
    assumptions: list[str]
    notes: list[str] = []


@lru_cache(maxsize=1)
def reference_prices() -> dict[str, Price]:
    """Reference USD per GPU-hour by GPU model, from prices-reference.csv."""
    with open(PRICES_FILE, newline="") as f:
        rows = list(csv.DictReader(f))
    out = {}
    for key, (gpu, provider, offer) in REFERENCE_OFFERS.items():
        for row in rows:
            if (row["gpu"], row["provider"], row["offer"]) == (gpu, provider, offer):
                region = f", {row['region']}" if row["region"] else ""
                out[key] = Price(
                    usd_per_gpu_hour=float(row["usd_per_gpu_hour"]),
                    source=f"{provider} {offer}{region}",
                    as_of=row["as_of"],
                )
    return out


def _gpu_filter(names: list[str]) -> list[GpuModel]:
    models = gpu_models()
    if not names:
        return list(models.values())
    out = []
    for n in names:
        key = model_key(n) or next((k for k in models if k.lower() == n.strip().lower()), None)
        if key is None:
            raise SizingError("gpus", f"unknown GPU model {n!r}; known: {', '.join(models)}")
        if models[key] not in out:
            out.append(models[key])
    return out


def _prices(overrides: dict[str, float]) -> dict[str, Price]:
    prices = dict(reference_prices())
    for name, usd in overrides.items():
        key = model_key(name) or next((k for k in gpu_models() if k.lower() == name.lower()), None)
        if key is None:
            raise SizingError("prices", f"unknown GPU model {name!r}; known: {', '.join(gpu_models())}")
        if not 0 < usd < float("inf"):
            raise SizingError("prices", f"{name}: price must be a positive number of USD per GPU-hour, got {usd}")
        prices[key] = Price(usd_per_gpu_hour=usd, source="given", reference=False)
    return prices


def splits_for(w: Workload, count: int) -> list[Split]:
    """Every way to lay the workload over `count` GPUs: tp x pp (x dp for training)."""
    a = w.arch
    out: list[Split] = []
    for tp in (1, 2, 4, 8):
        if tp > min(count, GPUS_PER_NODE) or count % tp or a.heads % tp:
            continue
        if a.kv_heads % tp and tp % a.kv_heads:
            continue  # KV heads must split evenly or replicate evenly
        rest = count // tp
        pps = [rest] if w.task == "serve" else [p for p in range(1, rest + 1) if rest % p == 0]
        out.extend(Split(tp, pp, rest // pp) for pp in pps if pp <= a.layers)
    return out


def _counts(max_gpus: int) -> list[int]:
    out, n = [], 1
    while n <= max_gpus:
        out.append(n)
        n *= 2
    return out


def _cost_key(w: Workload, o: Option) -> tuple[bool, float, float, int]:
    money = o.usd_per_million_tokens if w.training else o.usd_per_hour
    return (money is None, money or 0.0, -o.tokens_per_s, o.count)


def _speed(w: Workload, gpu: GpuModel, split: Split) -> Speed:
    if w.training:
        return training_speed(w, gpu, split, gpu_models()[REFERENCE_GPU], multi_gpu_efficiency())
    return serving_speed(w, gpu, split)


def _options(w: Workload, gpus: list[GpuModel], prices: dict[str, Price], max_gpus: int) -> list[Option]:
    options: list[Option] = []
    for gpu in gpus:
        capacity = gpu.memory_mib * MiB
        budget = int(capacity * w.memory_budget)  # what the stack may use of it
        for count in _counts(max_gpus):
            found = []
            for split in splits_for(w, count):
                mem = per_gpu_memory(w, split)
                if mem.total_bytes > budget:
                    continue
                speed = _speed(w, gpu, split)
                price = prices.get(gpu.key)
                per_hour = price.usd_per_gpu_hour * count if price else None
                per_m = per_hour / (speed.tokens_per_s * 3600) * 1e6 if per_hour is not None else None
                cost = per_hour * speed.seconds / 3600 if per_hour is not None and speed.seconds else None
                found.append(
                    Option(
                        gpu=gpu.key, count=count, split=split.label, tp=split.tp, pp=split.pp, dp=split.dp,
                        per_gpu_bytes=mem.total_bytes, capacity_bytes=capacity, budget_bytes=budget,
                        stage=mem.stage,
                        memory_bytes={i.key: i.bytes for i in mem.items if i.counted},
                        tokens_per_s=speed.tokens_per_s, seconds=speed.seconds,
                        per_sequence_tokens_per_s=speed.per_sequence_tokens_per_s, bound=speed.bound,
                        implied_mfu=speed.implied_mfu, efficiency=speed.efficiency,
                        usd_per_hour=per_hour, usd_per_million_tokens=per_m, cost_usd=cost,
                    )
                )
            if found:
                # Ties (the time model does not price tensor-parallel traffic) go to the
                # smallest tp where there is no NVLink, then to the most headroom.
                pcie = gpu.nvlink_gbps == 0
                best = max(found, key=lambda o: (round(o.tokens_per_s, 6), -o.tp if pcie else 0, -o.per_gpu_bytes))
                best.best_split = True
                options.extend(found)
    if not options:
        return options
    fastest = max(o.tokens_per_s for o in options)
    for o in options:
        o.times_slower = fastest / o.tokens_per_s
    for rank, o in enumerate(sorted(options, key=lambda o: (-o.tokens_per_s, _cost_key(w, o))), 1):
        o.time_rank = rank
    options.sort(key=lambda o: _cost_key(w, o))
    for rank, o in enumerate(options, 1):
        o.cost_rank = rank
    return options


def _gib(n: float) -> str:
    return f"{n / GiB:.1f} GiB"


def _tokens(n: int) -> str:
    return f"{n // 1024}K" if n % 1024 == 0 and n >= 1024 else str(n)


def _per_model_lines(w: Workload, gpus: list[GpuModel], options: list[Option], max_gpus: int) -> list[str]:
    smallest: dict[str, Option] = {}
    for option in options:
        if not option.best_split:
            continue
        if option.gpu not in smallest or option.count < smallest[option.gpu].count:
            smallest[option.gpu] = option
    fastest = max((o.tokens_per_s for o in smallest.values()), default=0.0)
    lines = []
    for gpu in gpus:
        o = smallest.get(gpu.key)
        if o is None:
            lines.append(f"{gpu.key}: does not fit on {max_gpus} or fewer")
            continue
        of = _gib(o.capacity_bytes) if o.budget_bytes == o.capacity_bytes else (
            f"{_gib(o.budget_bytes)} budget ({w.memory_budget:.0%} of {_gib(o.capacity_bytes)})")
        fit = f"({_gib(o.per_gpu_bytes)} of {of}{' each' if o.count > 1 else ''})"
        if o.count == 1:
            line = f"1x {gpu.key} fits {fit}"
        else:
            how = {"tp": "tensor-parallel", "pp": "pipeline", "fsdp": "FSDP-sharded"}
            kinds = [how[k] for k in ("tp", "pp", "fsdp") if any(p.startswith(k) for p in o.split.split())]
            line = f"{gpu.key}: needs {o.count} with {' + '.join(kinds)} split ({o.split}; {fit[1:-1]})"
        ratio = fastest / o.tokens_per_s
        if ratio >= 1.05:
            line += f", {ratio:.1f}x slower"
        lines.append(line)
    return lines


def _assumptions(w: Workload, gpus: list[GpuModel], prices: dict[str, Price]) -> list[str]:
    ref = gpu_models()[REFERENCE_GPU]
    cls = WORKLOAD_CLASS[w.task]
    priced = "; ".join(
        f"{k} ${p.usd_per_gpu_hour:g} ({p.source}{', ' + p.as_of if p.as_of else ''})"
        for k, p in prices.items() if k in {g.key for g in gpus}
    )
    out = [
        f"Prices per GPU-hour: {priced}. Reference prices are on-demand cloud list prices from "
        "shared/data/prices-reference.csv, not what this fleet pays; billing's price book replaces them once it "
        "exists.",
        "Memory: framework/CUDA overhead is 1 GiB per GPU (+0.5 GiB NCCL when multi-GPU) plus 5% allocator "
        "fragmentation; a GPU's capacity is the memory nvidia-smi reports (gpu_models.yaml memory_mib).",
        f"Stack: {STACKS[w.stack]}; a configuration fits when its heaviest GPU needs at most "
        f"{w.memory_budget:.0%} of the GPU's memory"
        + (" (set with gpu_memory_utilization / --gpu-memory-utilization)." if w.task == "serve" else
           (" (training_stack / --training-stack: peft or unsloth)." if w.adapters else ".")),
        f"Splits: tensor parallel (tp) within one node of {GPUS_PER_NODE} GPUs, splitting every layer and the KV "
        "heads; pipeline parallel (pp) gives each GPU a run of layers"
        + ("; pipelines run 1F1B, so the first stage holds pp micro-batches of activations; fsdp shards weights, "
           "gradients and optimizer states over data-parallel replicas (ZeRO-3/FSDP)." if w.training else "."),
    ]
    if w.training:
        speeds = ", ".join(f"{g.key} {g.speed[cls]:g}" for g in gpus)
        out.append(
            f"Training time: FLOPs per token 6N + 12·L·H·Q·T (PaLM; 4N for LoRA/QLoRA, whose frozen base needs no "
            f"weight gradients) at MFU {mfu(w):.0%} of the reference {ref.key}'s {ref.bf16_dense_tflops:g} TFLOPS "
            f"bf16 dense; other GPUs scale by gpu_models.yaml speed[{cls}] ({speeds}), multi-GPU efficiency "
            f"(NVLink 1.0, PCIe 0.75, across nodes 0.9) and the pipeline bubble with {PIPELINE_MICROBATCHES} "
            "micro-batches per step."
        )
        out.append(
            "Activations: bf16, flash attention (no score matrix), sequence parallel under tensor parallelism; "
            "with checkpointing each layer keeps its input and one layer is recomputed at a time."
        )
    else:
        out.append(
            "Serving tokens/s is an upper bound for decoding: each step reads the weights (the experts the step's "
            "tokens reach, for MoE) and every sequence's KV cache at full context at peak memory bandwidth, and "
            "is capped by peak bf16 FLOPs; prefill time is not included."
        )
        a = w.arch
        out.append("KV cache: every sequence at full context; " + (
            f"{a.sliding_layers} of {a.layers} layers use a {a.sliding_window}-token sliding window and cache at "
            "most that many tokens (as vLLM's hybrid KV cache manager allocates them)." if a.sliding_window else
            "full attention in every layer (the config declares no sliding window)."))
    return out


def estimate(req: SizingRequest) -> SizingReport:
    """Memory line items, time and every feasible GPU configuration for one sizing question."""
    w = resolve(req)
    gpus = _gpu_filter(req.gpus)
    prices = _prices(req.prices)
    single = stage_memory(w, Split(), "all")
    options = _options(w, gpus, prices, req.max_gpus)
    lines = _per_model_lines(w, gpus, options, req.max_gpus)
    a = w.arch
    what = f"{TASK_NAMES[w.task]} {a.name} @ {_tokens(w.context)}"
    if w.batch > 1:
        what += f" x {w.batch} {'sequences' if w.task == 'serve' else 'per micro-batch'}"
    workload = {
        "task": w.task, "context": w.context, "batch": w.batch, "weight_dtype": w.weight_dtype,
        "kv_dtype": w.kv_dtype, "dataset_tokens": w.dataset_tokens, "epochs": w.epochs if w.training else None,
        "lora_rank": w.lora_rank, "lora_targets": list(w.lora_targets) or None, "optimizer": w.optimizer,
        "checkpointing": w.checkpointing if w.training else None, "mfu": mfu(w) if w.training else None,
        "max_gpus": req.max_gpus, "stack": w.stack, "memory_budget": w.memory_budget,
    }
    return SizingReport(
        summary=f"{what}: {'; '.join(lines)}",
        model={**a.model_dump(exclude={"notes"}), **a.summary()},
        workload=workload,
        memory=single.items,
        memory_total_bytes=single.total_bytes,
        flops_per_token=training_flops_per_token(w) if w.training else None,
        options=options,
        per_gpu_model=lines,
        prices={k: p for k, p in prices.items() if k in {g.key for g in gpus}},
        assumptions=_assumptions(w, gpus, prices),
        notes=list(a.notes),
    )


def memory_floor_mib(req: SizingRequest, gpus: int) -> float:
    """Least memory per GPU (MiB) the workload needs spread over `gpus` GPUs, whatever their model."""
    w = resolve(req)
    splits = splits_for(w, gpus)
    if not splits:
        raise SizingError(
            "gpus", f"{w.arch.name} cannot be split over {gpus} GPUs (tensor parallel must divide its heads)")
    return min(per_gpu_memory(w, s).total_bytes for s in splits) / MiB
