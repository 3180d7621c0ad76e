#!/usr/bin/env python3
"""Check the agent on a real GPU node: NVML backend vs `nvidia-smi -q`, then a `test-gpu` burn-in. Reports in $OUT.

    python3 scripts/hardware_check.py [--out DIR] [--stress 180] [--samples 50]

Needs only the NVIDIA driver, nvidia-smi, and WhaleFlux's few run-time packages (pydantic, PyYAML, structlog,
nvidia-ml-py, and cuda-bindings for the burn-in); no network, no NATS or Redis, no install of WhaleFlux itself
(it runs from the checkout). docs/hardware/README.md says how to run it on the lent H200 machine in one command.
It writes, under --out (default $OUT, else ./hardware-report):

- `nvml_vs_smi.json` and `nvml_vs_smi.md`: every field the NVML backend reports (identity and one sample) beside
  what `nvidia-smi -q -x` says for it (model, memory, clocks, power, temperature limits, ECC, NVLink, PCIe, MIG),
  equal / within tolerance / different, plus what nvidia-smi knows that the agent does not report; and the CPU
  time one NVML sample costs per GPU;
- `test_gpu.json` and `test_gpu.txt`: the burn-in's report (as `whaleflux test-gpu --json`) and its table;
- `environment.json`: driver, CUDA and package versions, and any step that failed (each step runs even if an
  earlier one failed).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _import_from_checkout() -> None:
    """Make whaleflux.{shared,agent} importable from the checkout when WhaleFlux is not installed (pyproject maps
    whaleflux.shared to shared/ and whaleflux.agent to services/agent/)."""
    try:
        import whaleflux.agent  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(ROOT))
        import whaleflux

        whaleflux.__path__.extend([str(ROOT), str(ROOT / "services")])


# ----------------------------------------------------------------------------------------------- nvidia-smi

Section = dict[str, Any]  # "Key" -> "value" or a nested Section, as `nvidia-smi -q` indents them
YES_NO = {"Yes": True, "No": False}
NOT_A_VALUE = ("N/A", "", "[N/A]", "Not Supported", "[Not Supported]", "Unknown Error")


def parse_smi(text: str) -> tuple[Section, list[Section]]:
    """`nvidia-smi -q` text -> (the header: driver and CUDA versions, ...), one Section per GPU."""
    header: Section = {}
    gpus: list[Section] = []
    stack: list[tuple[int, Section]] = [(-1, header)]
    for raw in text.splitlines():
        if not raw.strip() or raw.startswith("="):
            continue
        indent = len(raw) - len(raw.lstrip(" "))
        if indent == 0 and re.fullmatch(r"GPU [0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+\.\d", raw.strip()):
            gpus.append({"Bus Id": raw.strip()[4:]})
            stack = [(0, gpus[-1])]
            continue
        key, sep, value = raw.strip().partition(" : ") if " : " in raw else raw.strip().partition(":")
        while len(stack) > 1 and stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1]
        if sep and value.strip():
            parent[key.strip()] = value.strip()
        elif not sep or not value.strip():
            child: Section = {}
            parent[key.strip()] = child
            stack.append((indent, child))
    return header, gpus


def _get(gpu: Section, path: str) -> str | None:
    node: Any = gpu
    for part in path.split("/"):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return None if not isinstance(node, str) or node in NOT_A_VALUE else node


def _num(gpu: Section, *paths: str) -> float | None:
    """'81559 MiB', '700.00 W', '1980 MHz', '-2 C', '16x' -> the number at the first path that has one."""
    for path in paths:
        value = _get(gpu, path)
        if value is not None:
            try:
                return float(value.split()[0].rstrip("x"))
            except ValueError:
                continue
    return None


def _sum(gpu: Section, *paths: str) -> float | None:
    values = [v for p in paths if (v := _num(gpu, p)) is not None]
    return sum(values) if values else None


def _absolute_limit(gpu: Section, name: str) -> float | None:
    """A limit as an absolute temperature: 'GPU Slowdown Temp', or from the T.Limit form newer drivers print
    (limit = current + margin - its T.Limit offset: margin 57 at 30 C and slowdown -2 give 89 C)."""
    absolute = _num(gpu, f"Temperature/GPU {name} Temp")
    if absolute is not None:
        return absolute
    current, margin = _num(gpu, "Temperature/GPU Current Temp"), _num(gpu, "Temperature/GPU T.Limit Temp")
    offset = _num(gpu, f"Temperature/GPU {name} T.Limit Temp")
    return None if None in (current, margin, offset) else current + margin - offset  # type: ignore[operator]


def _kib_per_s(gpu: Section, path: str) -> float | None:
    value = _num(gpu, path)
    return None if value is None else value * 1024  # as the agent reads NVML's KB/s


THROTTLE_NAMES = {"SW Power Cap": "sw_power_cap", "HW Slowdown": "hw_slowdown",
                  "SW Thermal Slowdown": "sw_thermal_slowdown", "HW Thermal Slowdown": "hw_thermal_slowdown",
                  "HW Power Brake Slowdown": "hw_power_brake_slowdown"}


def _throttles(gpu: Section) -> list[str]:
    reasons = gpu.get("Clocks Event Reasons") or gpu.get("Clocks Throttle Reasons") or {}
    flat: dict[str, Any] = {}
    for key, value in reasons.items():
        flat |= value if isinstance(value, dict) else {key: value}
        if isinstance(value, dict):
            flat[key] = "Not Active"
    return sorted(THROTTLE_NAMES[k] for k, v in flat.items() if k in THROTTLE_NAMES and v == "Active")


def smi_fields(gpu: Section) -> dict[str, Any]:
    """What nvidia-smi says for each field the agent reports, named as the agent names them."""
    return {
        "name": _get(gpu, "Product Name"),
        "uuid": _get(gpu, "GPU UUID"),
        "serial": _get(gpu, "Serial Number"),
        "vbios_version": _get(gpu, "VBIOS Version"),
        "pci_bus_id": _get(gpu, "PCI/Bus Id") or _get(gpu, "Bus Id"),
        "memory_total_mib": _num(gpu, "FB Memory Usage/Total"),
        "memory_used_mib": _num(gpu, "FB Memory Usage/Used"),
        "memory_free_mib": _num(gpu, "FB Memory Usage/Free"),
        "memory_reserved_mib": _num(gpu, "FB Memory Usage/Reserved"),
        "utilization_gpu_pct": _num(gpu, "Utilization/Gpu"),
        "utilization_memory_pct": _num(gpu, "Utilization/Memory"),
        "encoder_util_pct": _num(gpu, "Utilization/Encoder"),
        "decoder_util_pct": _num(gpu, "Utilization/Decoder"),
        "temperature_c": _num(gpu, "Temperature/GPU Current Temp"),
        "memory_temperature_c": _num(gpu, "Temperature/Memory Current Temp"),
        "slowdown_temperature_c": _absolute_limit(gpu, "Slowdown"),
        "shutdown_temperature_c": _absolute_limit(gpu, "Shutdown"),
        "thermal_margin_c": _num(gpu, "Temperature/GPU T.Limit Temp"),
        "power_w": _num(gpu, "GPU Power Readings/Power Draw", "GPU Power Readings/Instantaneous Power Draw",
                        "Power Readings/Power Draw"),
        "power_limit_w": _num(gpu, "GPU Power Readings/Current Power Limit", "GPU Power Readings/Enforced Power Limit",
                              "Power Readings/Enforced Power Limit"),
        "sm_clock_mhz": _num(gpu, "Clocks/SM"),
        "mem_clock_mhz": _num(gpu, "Clocks/Memory"),
        "throttle_reasons": _throttles(gpu),
        "ecc_corrected": _sum(gpu, "ECC Errors/Volatile/SRAM Correctable", "ECC Errors/Volatile/DRAM Correctable",
                              "ECC Errors/Volatile/Single Bit/Total"),
        "ecc_uncorrected": _sum(gpu, "ECC Errors/Volatile/SRAM Uncorrectable Parity",
                                "ECC Errors/Volatile/SRAM Uncorrectable SEC-DED",
                                "ECC Errors/Volatile/DRAM Uncorrectable", "ECC Errors/Volatile/SRAM Uncorrectable",
                                "ECC Errors/Volatile/Double Bit/Total"),
        "remapped_rows_correctable": _num(gpu, "Remapped Rows/Correctable Error"),
        "remapped_rows_uncorrectable": _num(gpu, "Remapped Rows/Uncorrectable Error"),
        "row_remap_failure": YES_NO.get(_get(gpu, "Remapped Rows/Remapping Failure Occurred") or ""),
        "pcie_replay_count": _num(gpu, "PCI/Replays Since Reset"),
        "pcie_tx_bytes_per_s": _kib_per_s(gpu, "PCI/Tx Throughput"),
        "pcie_rx_bytes_per_s": _kib_per_s(gpu, "PCI/Rx Throughput"),
        # Not in the agent's sample: shown so that a reader sees what the node could also report.
        "not_reported.ecc_mode": _get(gpu, "ECC Mode/Current"),
        "not_reported.mig_mode": _get(gpu, "MIG Mode/Current"),
        "not_reported.pcie_gen": _get(gpu, "PCI/GPU Link Info/PCIe Generation/Current"),
        "not_reported.pcie_gen_max": _get(gpu, "PCI/GPU Link Info/PCIe Generation/Max"),
        "not_reported.pcie_width": _get(gpu, "PCI/GPU Link Info/Link Width/Current"),
        "not_reported.pcie_width_max": _get(gpu, "PCI/GPU Link Info/Link Width/Max"),
        "not_reported.compute_mode": _get(gpu, "Compute Mode"),
        "not_reported.persistence_mode": _get(gpu, "Persistence Mode"),
        "not_reported.performance_state": _get(gpu, "Performance State"),
        "not_reported.max_sm_clock_mhz": _get(gpu, "Max Clocks/SM"),
        "not_reported.power_limit_min_max_w": f"{_get(gpu, 'GPU Power Readings/Min Power Limit')} .. "
                                              f"{_get(gpu, 'GPU Power Readings/Max Power Limit')}",
    }


def _smi(*args: str) -> str:
    done = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=60, check=True)  # noqa: S607
    return done.stdout


def smi_nvlink() -> dict[int, int]:
    """Active NVLink links per GPU index, from `nvidia-smi nvlink -s` ({} without NVLink)."""
    try:
        text = _smi("nvlink", "-s")
    except subprocess.CalledProcessError:
        return {}  # no NVLink on this machine
    links: dict[int, int] = {}
    index = -1
    for line in text.splitlines():
        if line.startswith("GPU "):
            index += 1
            links[index] = 0
        elif "Link" in line and "GB/s" in line and index >= 0:
            links[index] += 1
    return links


# ----------------------------------------------------------------------------------------------- comparison

# Readings that move between two reads get a tolerance: (absolute, relative).
TOLERANCE: dict[str, tuple[float, float]] = {
    "temperature_c": (3, 0), "memory_temperature_c": (3, 0), "thermal_margin_c": (3, 0), "power_w": (30, 0.15),
    "sm_clock_mhz": (100, 0.1), "mem_clock_mhz": (100, 0.05), "utilization_gpu_pct": (20, 0),
    "memory_used_mib": (1024, 0), "memory_free_mib": (1024, 0), "pcie_tx_bytes_per_s": (1e9, 0),
    "pcie_rx_bytes_per_s": (1e9, 0),
}


def judge(field: str, ours: Any, theirs: Any) -> str:
    """equal | close (within the reading's tolerance) | different | agent-only | smi-only | neither."""
    if ours is None and theirs is None:
        return "neither"
    if ours is None:
        return "smi-only"
    if theirs is None:
        return "agent-only"
    if isinstance(ours, list) or isinstance(theirs, list):
        return "equal" if sorted(ours) == sorted(theirs) else "different (may change between reads)"
    if isinstance(ours, bool) or isinstance(theirs, str) and not _is_number(theirs):
        return "equal" if str(ours).lower() in (str(theirs).lower(), {"no": "false", "yes": "true"}.get(
            str(theirs).lower(), "")) else "different"
    a, b = float(ours), float(theirs)
    if a == b:
        return "equal"
    absolute, relative = TOLERANCE.get(field, (0.5, 0))
    return "close" if abs(a - b) <= max(absolute, relative * max(abs(a), abs(b))) else "different"


def _is_number(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


def _bus_id(value: str | None) -> str | None:
    """NVML and nvidia-smi both say 00000000:18:00.0; compare case-blind."""
    return value.upper() if value else None


def compare(samples: int) -> dict[str, Any]:
    """One NVML identity and sample per GPU beside nvidia-smi's; the CPU cost of sampling."""
    from whaleflux.agent.nvml import NvmlBackend

    backend = NvmlBackend()
    try:
        identities = backend.identities()
        cpu = []
        for _ in range(samples):
            t = time.process_time()
            batch = backend.sample(datetime.now(UTC))
            cpu.append(time.process_time() - t)
            time.sleep(0.1)
        header, smi_gpus = parse_smi(_smi("-q"))
        nvlink = smi_nvlink()
        by_bus = {_bus_id(_get(g, "Bus Id")): g for g in smi_gpus}
        gpus = []
        for ident, sample in zip(identities, batch, strict=False):
            theirs = smi_fields(by_bus.get(_bus_id(ident.pci_bus_id)) or {})
            ours = {**sample.model_dump(exclude={"processes", "xid_errors"}),
                    **ident.model_dump(exclude={"index", "model", "driver_version"})}
            ours["pci_bus_id"], theirs["pci_bus_id"] = _bus_id(ours["pci_bus_id"]), _bus_id(theirs["pci_bus_id"])
            theirs["nvlink_links_active"] = nvlink.get(ident.index)
            rows = [{"field": f, "agent": ours.get(f), "nvidia_smi": theirs.get(f),
                     "verdict": judge(f, ours.get(f), theirs.get(f))}
                    for f in sorted(set(ours) | set(theirs))]
            gpus.append({"index": ident.index, "model": ident.model, "throttle_reasons": sample.throttle_reasons,
                         "rows": rows})
        per_gpu_ms = 1000 * sum(cpu) / len(cpu) / max(len(identities), 1)
        return {"driver_version": header.get("Driver Version"), "cuda_version": header.get("CUDA Version"),
                "gpus": gpus, "nvml_sample_cpu_ms_per_gpu": round(per_gpu_ms, 3), "samples_timed": samples}
    finally:
        backend.close()


def comparison_markdown(doc: dict[str, Any]) -> str:
    lines = [f"# NVML backend vs nvidia-smi -q (driver {doc['driver_version']}, CUDA {doc['cuda_version']})", "",
             f"One NVML sample costs {doc['nvml_sample_cpu_ms_per_gpu']} ms of CPU per GPU "
             f"(mean of {doc['samples_timed']} samples; target <= 5 ms).", ""]
    for gpu in doc["gpus"]:
        lines += [f"## GPU {gpu['index']} ({gpu['model']}); throttle reasons: {gpu['throttle_reasons'] or 'none'}", "",
                  "| field | agent (NVML) | nvidia-smi | verdict |", "|---|---|---|---|"]
        lines += [f"| {r['field']} | {r['agent']} | {r['nvidia_smi']} | {r['verdict']} |" for r in gpu["rows"]]
        lines.append("")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------- burn-in


def burn_in(stress_s: float, simulate: str | None = None) -> tuple[dict[str, Any], str]:
    from rich.console import Console

    from whaleflux.agent.burnin.local import burn_in_here, burn_in_simulated
    from whaleflux.agent.burnin.plan import make_plan
    from whaleflux.commands.testgpu import render

    plan = make_plan(duration=f"{stress_s:g}s")
    if simulate:
        report = burn_in_simulated(plan, simulate, gpus=1)
    else:
        report = burn_in_here(plan, progress=lambda line: print(line, flush=True))
    console = Console(record=True, width=200)
    console.print(render(report))
    console.print(f"verdict: {report.verdict}; NVML sample CPU per GPU: {report.sample_cpu_ms_per_gpu} ms")
    return report.model_dump(mode="json"), console.export_text()


# ----------------------------------------------------------------------------------------------- main


def _versions() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in ("pydantic", "pydantic-core", "PyYAML", "structlog", "nvidia-ml-py", "cuda-bindings", "rich"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "hardware-report")))
    ap.add_argument("--stress", type=float, default=180.0, help="seconds of compute/thermal stress in the burn-in")
    ap.add_argument("--samples", type=int, default=50, help="NVML samples timed for the sampling cost")
    ap.add_argument("--simulate", metavar="MODEL", help="dry run without a GPU: burn in one simulated GPU instead")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    _import_from_checkout()
    env: dict[str, Any] = {"started_at": datetime.now(UTC).isoformat(), "host": platform.node(),
                           "packages": _versions(), "failed": {}}
    try:
        doc = compare(args.samples)
        (args.out / "nvml_vs_smi.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
        (args.out / "nvml_vs_smi.md").write_text(comparison_markdown(doc) + "\n")
        env |= {"driver_version": doc["driver_version"], "cuda_version": doc["cuda_version"]}
        print(comparison_markdown(doc), flush=True)
    except Exception:  # noqa: BLE001  (every step runs and reports; a failure is written down, not fatal)
        env["failed"]["compare"] = traceback.format_exc()
        print(env["failed"]["compare"], file=sys.stderr, flush=True)
    try:
        report, table = burn_in(args.stress, args.simulate)
        (args.out / "test_gpu.json").write_text(json.dumps(report, indent=2) + "\n")
        (args.out / "test_gpu.txt").write_text(table)
        print(table, flush=True)
    except Exception:  # noqa: BLE001  (as above)
        env["failed"]["burn_in"] = traceback.format_exc()
        print(env["failed"]["burn_in"], file=sys.stderr, flush=True)
    env["finished_at"] = datetime.now(UTC).isoformat()
    (args.out / "environment.json").write_text(json.dumps(env, indent=2) + "\n")
    return 1 if env["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
