"""scripts/hardware_check.py's reading of `nvidia-smi -q` (captures from H200, H100 and RTX 4090 nodes) and its
field-by-field judgement; the run on a GPU itself is docs/hardware/'s."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import hardware_check as hc  # noqa: E402

CAPTURES = Path(__file__).parent / "data" / "nvidia-smi"


def load(name: str):
    return hc.parse_smi((CAPTURES / name).read_text())


def test_h200_capture_reads_as_the_agents_fields():
    header, gpus = load("H200_nvidia-smi-q.txt")
    assert header["Driver Version"] == "550.90.12" and header["CUDA Version"] == "12.4"
    [gpu] = gpus
    f = hc.smi_fields(gpu)
    assert f["name"] == "NVIDIA H200" and f["uuid"] == "GPU-cb3dfa52-e2f3-9ca4-a399-7d16041c3732"
    assert f["pci_bus_id"] == "00000000:03:00.0" and f["vbios_version"] == "96.00.A5.00.03"
    assert (f["memory_total_mib"], f["memory_reserved_mib"], f["memory_used_mib"], f["memory_free_mib"]) == (
        143771, 700, 1, 143072)
    assert f["temperature_c"] == 28 and f["thermal_margin_c"] == 59 and f["memory_temperature_c"] == 25
    # This driver prints limits only against T.Limit (28 + 59 = 87): slowdown -2 is 89 C, shutdown -8 is 95 C.
    assert f["slowdown_temperature_c"] == 89 and f["shutdown_temperature_c"] == 95
    assert f["power_w"] == 74.58 and f["power_limit_w"] == 700
    assert f["sm_clock_mhz"] == 345 and f["mem_clock_mhz"] == 3199
    assert f["ecc_corrected"] == 0 and f["ecc_uncorrected"] == 0 and f["row_remap_failure"] is False
    assert f["pcie_replay_count"] == 0 and f["pcie_tx_bytes_per_s"] == 657 * 1024
    assert f["throttle_reasons"] == []  # only "Idle" is active
    assert (f["encoder_util_pct"], f["decoder_util_pct"]) == (0, 0)
    assert f["not_reported.mig_mode"] == "Disabled" and f["not_reported.ecc_mode"] == "Enabled"
    assert (f["not_reported.pcie_gen"], f["not_reported.pcie_width"]) == ("5", "16x")


def test_every_gpu_of_an_eight_gpu_node_is_read():
    _, gpus = load("H100SXMx8_nvidia-smi-q.txt")
    fields = [hc.smi_fields(g) for g in gpus]
    assert len(fields) == 8 and len({f["uuid"] for f in fields}) == 8
    assert all(f["name"] == "NVIDIA H100 80GB HBM3" and f["memory_total_mib"] == 81559 for f in fields)


def test_a_consumer_card_lacks_what_it_does_not_support():
    _, gpus = load("RTX4090_nvidia-smi-q.txt")
    f = hc.smi_fields(gpus[0])
    assert f["name"] == "NVIDIA GeForce RTX 4090"
    assert f["ecc_corrected"] is None and f["memory_temperature_c"] is None


def test_judgement_allows_readings_that_move_and_nothing_else():
    assert hc.judge("memory_total_mib", 143771.0, 143771.0) == "equal"
    assert hc.judge("memory_total_mib", 143771.0, 143770.0) == "different"
    assert hc.judge("temperature_c", 30.0, 32.0) == "close"
    assert hc.judge("temperature_c", 30.0, 40.0) == "different"
    assert hc.judge("power_w", 600.0, 650.0) == "close"  # 15% of a moving reading
    assert hc.judge("name", "NVIDIA H200", "NVIDIA H200") == "equal"
    assert hc.judge("row_remap_failure", False, False) == "equal"
    assert hc.judge("ecc_uncorrected", None, 0.0) == "smi-only"
    assert hc.judge("memory_temperature_c", 36.0, None) == "agent-only"
    assert hc.judge("throttle_reasons", ["sw_power_cap"], []) == "different (may change between reads)"
