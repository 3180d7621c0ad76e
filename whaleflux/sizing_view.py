"""Tables for `whaleflux size`: the report of whaleflux.shared.sizing, for people."""

from __future__ import annotations

import json

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from whaleflux.shared.sizing import CATALOGUE, SizingReport
from whaleflux.shared.sizing.recommend import Option

GiB = 1024**3


def _gib(n: float) -> str:
    return f"{n / GiB:,.1f} GiB"


def _duration(seconds: float) -> str:
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 72 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def _usd(x: float | None) -> str:
    if x is None:
        return "-"
    return f"${x:,.2f}" if x >= 1 else f"${x:.3f}"


def _billions(n: int) -> str:
    return f"{n / 1e9:.2f} B"


def render_catalogue(console: Console, as_json: bool) -> None:
    if as_json:
        catalogue = {n: {**a.model_dump(exclude={"notes"}), **a.summary()} for n, a in CATALOGUE.items()}
        print(json.dumps(catalogue, indent=2))
        return
    table = Table("model", "parameters", "active", "layers", "hidden", "heads / KV", "head dim", "MLP", "vocab",
                  "max context", "source")
    for name, a in CATALOGUE.items():
        mlp = f"{a.experts}x{a.expert_intermediate} top-{a.experts_per_token}" if a.is_moe else str(a.intermediate)
        table.add_row(
            name, _billions(a.total_params()), _billions(a.active_params()), str(a.layers), str(a.hidden),
            f"{a.heads} / {a.kv_heads}", str(a.head_dim), mlp, str(a.vocab), str(a.max_context),
            a.source.removeprefix("huggingface.co/").removesuffix("/config.json"),
        )
    console.print(table)


def render_report(console: Console, report: SizingReport, all_splits: bool) -> None:
    m, w = report.model, report.workload
    training = w["task"] != "serve"
    console.print(f"[bold]{escape(report.summary)}[/bold]", soft_wrap=True)
    shape = (f"{m['layers']} layers, hidden {m['hidden']}, {m['heads']} heads / {m['kv_heads']} KV heads "
             f"x {m['head_dim']}")
    if m["experts"]:
        shape += f", {m['experts']} experts (top-{m['experts_per_token']})"
    active = f" ({_billions(m['active_params'])} active)" if m["experts"] else ""
    console.print(f"{escape(m['name'])}: {_billions(m['total_params'])} parameters{active}; {shape}; "
                  f"max context {m['max_context']}; {escape(m['source'])}", soft_wrap=True)
    for note in report.notes:
        console.print(f"[yellow]note:[/yellow] {escape(note)}", soft_wrap=True)

    table = Table(title="Memory on one GPU, before any split", title_justify="left")
    table.add_column("item")
    table.add_column("size", justify="right")
    table.add_column("how", overflow="fold")
    for item in report.memory:
        label = item.label if item.counted else f"[dim]{item.label} (not counted)[/dim]"
        table.add_row(label, _gib(item.bytes), item.note)
    table.add_row("[bold]total[/bold]", f"[bold]{_gib(report.memory_total_bytes)}[/bold]", "")
    console.print(table)

    if training and report.flops_per_token:
        flops = report.flops_per_token["total"]
        line = f"training: {flops / 1e9:,.0f} GFLOPs per token (forward + backward)"
        if w["dataset_tokens"]:
            total = flops * w["dataset_tokens"] * w["epochs"]
            epochs = f"{w['epochs']:g} epoch{'' if w['epochs'] == 1 else 's'}"
            line += f"; {w['dataset_tokens']:,} tokens x {epochs} = {total:.2e} FLOPs; MFU {w['mfu']:.0%} on A100"
        console.print(line)

    shown = [o for o in report.options if all_splits or o.best_split]
    if not shown:
        console.print("[red]no GPU configuration fits[/red] (raise --max-gpus, or shrink context, batch or dtype)")
    else:
        console.print(_options_table(shown, training, all_splits))
    for line in report.assumptions:
        console.print(f"[dim]- {escape(line)}[/dim]", soft_wrap=True)


def _options_table(shown: list[Option], training: bool, all_splits: bool) -> Table:
    """The feasible configurations, cheapest first, with their time rank among the rows shown."""
    title = ("Every feasible configuration" if all_splits
             else "Feasible configurations (fastest split per GPU count)")
    table = Table(title=f"{title}, cheapest first", title_justify="left")
    for col in ("#", "GPU", "count", "split", "memory / budget"):
        table.add_column(col, justify="right" if col in ("#", "count") else "left", no_wrap=True)
    if training:
        table.add_column("tokens/s", justify="right")
        table.add_column("time", justify="right")
        table.add_column("cost", justify="right")
        table.add_column("$ / 1M tokens", justify="right")
    else:
        table.add_column("tokens/s (bound)", justify="right")
        table.add_column("per sequence", justify="right")
        table.add_column("$ / hour", justify="right")
        table.add_column("$ / 1M tokens", justify="right")
    table.add_column("time rank", justify="right")
    # Ranks among the rows shown (the JSON ranks every feasible option).
    by_time = {id(o): r for r, o in enumerate(sorted(shown, key=lambda o: o.time_rank), 1)}
    for rank, o in enumerate(shown, 1):
        mem = f"{_gib(o.per_gpu_bytes)} / {o.budget_bytes / GiB:.0f}"  # of the stack's budget
        row = [str(rank), o.gpu, str(o.count), o.split, mem, f"{o.tokens_per_s:,.0f}"]
        if training:
            row += [_duration(o.seconds) if o.seconds else "-", _usd(o.cost_usd), _usd(o.usd_per_million_tokens)]
        else:
            row += [f"{o.per_sequence_tokens_per_s:,.1f}", _usd(o.usd_per_hour), _usd(o.usd_per_million_tokens)]
        row.append(str(by_time[id(o)]))
        table.add_row(*row)
    return table
