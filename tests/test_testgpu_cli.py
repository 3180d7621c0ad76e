"""`whaleflux test-gpu`: the report card as a table and as JSON, exit codes, and options that are wrong."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from whaleflux.cli import app


def run(*args: str):
    return CliRunner().invoke(app, ["test-gpu", *args])


def test_healthy_simulated_gpus_pass_with_a_table_of_figures():
    done = run("--simulate", "H200", "--gpus", "2", "--duration", "1m")
    assert done.exit_code == 0, done.output
    assert "TFLOP/s fp32" in done.output and done.output.count("│ pass ") == 2
    assert done.output.rstrip().endswith("verdict: pass")


def test_injected_faults_fail_with_their_reasons_as_json_and_exit_1(tmp_path):
    path = tmp_path / "report.json"
    done = run("--simulate", "h200", "--gpus", "3", "--duration", "2m", "--inject", "cooling:1", "--inject",
               "vram-flip:2", "--json", "--report", str(path))
    assert done.exit_code == 1, done.output
    doc = json.loads(done.output)
    assert doc == json.loads(path.read_text())
    assert doc["verdict"] == "fail" and [g["verdict"] for g in doc["gpus"]] == ["pass", "fail", "warn"]
    assert any(r.startswith("thermal: throttled at ") for r in doc["gpus"][1]["reasons"])
    assert doc["gpus"][2]["reasons"] == ["health: 4 new corrected ECC error(s)"]
    assert doc["checks"] == ["compute", "memory", "bandwidth", "thermal"] and doc["duration_s"] == 120


def test_one_gpu_and_some_checks():
    done = run("--simulate", "A100", "--gpus", "4", "--gpu", "2", "--checks", "memory,bandwidth", "--json")
    assert done.exit_code == 0, done.output
    doc = json.loads(done.output)
    assert [g["index"] for g in doc["gpus"]] == [2]
    assert [c["check"] for c in doc["gpus"][0]["checks"]] == ["memory", "bandwidth", "health"]


def test_wrong_options_are_named_and_exit_2():
    for args, message in (
        (["--simulate", "H200", "--duration", "soon"], "error: --duration: 'soon' is not a duration"),
        (["--simulate", "H200", "--checks", "vram"], "error: --checks: vram; choose from compute"),
        (["--simulate", "B300"], "error: --simulate: no model 'B300'"),
        (["--simulate", "H200", "--gpus", "2", "--gpu", "5"], "error: --gpu: no GPU '5' on this node"),
        (["--simulate", "H200", "--inject", "meltdown:1"], "error: --inject: 'meltdown:1' is not FAULT:GPU"),
        (["--simulate", "RTX4090", "--inject", "nvlink-crc:0"], "error: --inject: kind: sim-01 has no NVLink"),
        (["--inject", "cooling:0"], "error: --inject: faults are injected only into simulated GPUs"),
    ):
        done = run(*args)
        assert done.exit_code == 2 and message in done.output, (args, done.output)


def _has_nvidia_driver() -> bool:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


def test_a_machine_without_the_nvidia_driver_is_told_so():
    if _has_nvidia_driver():
        pytest.skip("this machine has an NVIDIA driver: scripts/hardware_check.py burns its GPUs in")
    done = run("--duration", "10s")
    assert done.exit_code == 2
    assert "error: NVML:" in done.output and "runs on a node with the NVIDIA driver" in done.output
