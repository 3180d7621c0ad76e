"""`whaleflux size`: memory, time, GPUs and cost of serving or fine-tuning an LLM, computed locally."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from .terminal import bad_option, console, fail

if TYPE_CHECKING:
    from whaleflux.shared.sizing import SizingReport


def count(text: str, option: str, binary: bool) -> int:
    """"8192", "8K" (x1024 when binary, as context lengths go), "100M", "1.5B" (x1000)."""
    units = {"K": 1024 if binary else 1000, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12}
    raw = text.strip().upper()
    scale = units.get(raw[-1:], 1)
    try:
        value = float(raw[:-1] if scale != 1 else raw) * scale
    except ValueError:
        fail(f"{option} {text!r}: expected a number such as 8192, 8K, 100M or 1.5B")
    if not 1 <= value < 1e18 or value != int(value):
        fail(f"{option} {text!r}: expected a whole number of tokens >= 1")
    return int(value)


def _prices(items: list[str] | None) -> dict[str, float]:
    prices = {}
    for item in items or []:
        key, _, usd = item.partition("=")
        try:
            prices[key] = float(usd)
        except ValueError:
            fail(f"--price {item!r}: expected MODEL=USD, e.g. H100=2.5")
    return prices


# The option that sets each field of the sizing request (shared/sizing), to name it in an error.
FLAG_OF = {"model": "MODEL", "config": "MODEL", "weight_dtype": "--weights", "kv_dtype": "--kv-cache",
           "gpus": "--gpu", "prices": "--price", "dataset_tokens": "--tokens", "context": "--context"}


def flag_of(field: str) -> str:
    return FLAG_OF.get(field, "--" + field.replace("_", "-"))


def size(
    model: Annotated[str | None, typer.Argument(
        help="catalogue model (see --list) or a Hugging Face config.json (file or folder)")] = None,
    task: Annotated[str, typer.Option(help="serve | full | lora | qlora")] = "serve",
    context: Annotated[str, typer.Option(help="tokens per sequence, e.g. 8192 or 8K")] = "4096",
    batch: Annotated[int, typer.Option(help="serve: concurrent sequences; training: micro-batch per replica")] = 1,
    weights: Annotated[str | None, typer.Option(
        help="fp32 | bf16 | fp16 | fp8 | int8 | int4 | nf4 (default bf16; nf4 for qlora)")] = None,
    kv_cache: Annotated[str | None, typer.Option(help="serve: KV cache dtype (default bf16)")] = None,
    tokens: Annotated[str | None, typer.Option(help="training: dataset tokens per epoch, e.g. 100M")] = None,
    epochs: Annotated[float | None, typer.Option(help="training: epochs (default 1)")] = None,
    lora_rank: Annotated[int | None, typer.Option(help="lora/qlora: rank (default 16)")] = None,
    lora_targets: Annotated[str | None, typer.Option(
        help="lora/qlora: comma-separated of q,k,v,o,gate,up,down (default all)")] = None,
    optimizer: Annotated[str | None, typer.Option(help="training: adamw | adamw-8bit | sgd (default adamw)")] = None,
    checkpointing: Annotated[bool | None, typer.Option(
        "--checkpointing/--no-checkpointing", help="training: activation checkpointing (default on)")] = None,
    mfu: Annotated[float | None, typer.Option(
        help="training: model FLOPs utilization on an A100 (default 0.40; 0.30 qlora)")] = None,
    gpu_memory_utilization: Annotated[float | None, typer.Option(
        help="serve: share of each GPU's memory the serving stack may use (vLLM's; default 0.9)")] = None,
    training_stack: Annotated[str | None, typer.Option(
        help="lora/qlora: peft (PEFT + bitsandbytes, default) | unsloth (fused kernels)")] = None,
    gpu: Annotated[list[str] | None, typer.Option(
        help="GPU model(s) to consider; default all in gpu_models.yaml")] = None,
    max_gpus: Annotated[int, typer.Option(help="largest GPU count to consider")] = 64,
    price: Annotated[list[str] | None, typer.Option(
        help="MODEL=USD per GPU-hour instead of the reference price")] = None,
    all_splits: Annotated[bool, typer.Option(
        "--all", help="list every feasible split, not only the fastest per GPU count")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
    list_models: Annotated[bool, typer.Option("--list", help="list the catalogue models and exit")] = False,
) -> None:
    """Memory, time and GPUs for serving or fine-tuning an LLM (computed locally; no services needed)."""
    from whaleflux.sizing_view import render_catalogue, render_report

    if list_models:
        render_catalogue(console, as_json)
        return
    if model is None:
        fail("name a model (see `whaleflux size --list`) or a config.json")
    options = dict(
        task=task, batch=batch, weight_dtype=weights, kv_dtype=kv_cache, epochs=epochs, lora_rank=lora_rank,
        lora_targets=[t.strip() for t in lora_targets.split(",") if t.strip()] if lora_targets else None,
        optimizer=optimizer, checkpointing=checkpointing, mfu=mfu, gpus=gpu or [], max_gpus=max_gpus,
        gpu_memory_utilization=gpu_memory_utilization, training_stack=training_stack,
    )
    report = _estimate(model, context, tokens, price, options)
    if as_json:
        typer.echo(report.model_dump_json(indent=2))
    else:
        render_report(console, report, all_splits)


def _estimate(model: str, context: str, tokens: str | None, price: list[str] | None,
              options: dict[str, Any]) -> SizingReport:
    """The sizing report; a bad model, option or config file ends the command naming what is wrong."""
    from pydantic import ValidationError

    from whaleflux.shared import sizing

    fields: dict[str, Any] = {"model": model}
    try:
        if model.endswith(".json") or Path(model).is_dir() or Path(model).is_file():
            config, label = sizing.read_config_file(model)
            fields = {"config": config, "config_name": label}
        prices = _prices(price)
        request = sizing.SizingRequest(
            **fields, **options, context=count(context, "--context", binary=True),
            dataset_tokens=count(tokens, "--tokens", binary=False) if tokens else None, prices=prices,
        )
        return sizing.estimate(request)
    except sizing.SizingError as exc:
        fail(f"{flag_of(exc.field)}: {exc.message}")
    except ValidationError as exc:
        from whaleflux.client import expected_words

        err = exc.errors()[0]
        field = str(err["loc"][0]) if err["loc"] else "model"
        shown = err.get("input")
        bad_option(flag_of(field),
                   shown if isinstance(shown, str | int | float) else "", expected_words(err))
