"""`whaleflux size` and the scheduler's POST /v1/size: the sizing core behind a CLI and an HTTP endpoint."""

from __future__ import annotations

import json

import httpx
from typer.testing import CliRunner

from whaleflux.cli import app
from whaleflux.scheduler.app import SchedulerSettings, build

runner = CliRunner()


def size(*args: str):
    return runner.invoke(app, ["size", *args])


def _one_line_error(result, *words: str, code: int = 1) -> None:
    """One line naming the problem; exit code 1, or 2 for an option's value that is not one it takes."""
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    for w in words:
        assert w in lines[0]


def test_size_shows_line_items_and_the_issue_example_for_qlora_70b():
    result = size("llama-3-70b", "--task", "qlora", "--context", "8K", "--tokens", "100M")
    assert result.exit_code == 0, result.output
    out = result.output
    assert "QLoRA llama-3-70b @ 8K: 1x H100 fits" in out
    for line_item in ("weights (nf4)", "activations, with checkpointing", "activations, without checkpointing",
                      "LoRA adapter weights", "LoRA adapter optimizer states", "framework/CUDA overhead"):
        assert line_item in out
    assert "Reference prices" in out


def test_size_json_is_the_report_for_programs():
    result = size("mixtral-8x22b", "--context", "64K", "--batch", "32", "--gpu", "H200", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["workload"]["context"] == 65536 and report["workload"]["batch"] == 32
    kv = next(i for i in report["memory"] if i["key"] == "kv_cache")
    assert kv["bytes"] == 224 * 1024 * 65536 * 32
    assert {o["gpu"] for o in report["options"]} == {"H200"}
    assert report["options"][0]["count"] == 8 and report["options"][0]["split"] == "tp8"


def test_size_reads_a_config_json_folder(tmp_path):
    from tests.test_sizing import LLAMA3_8B_CONFIG

    folder = tmp_path / "my-llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA3_8B_CONFIG))
    result = size(str(folder), "--task", "lora", "--context", "2048", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["model"]["name"] == "my-llama"


def test_size_lists_the_catalogue():
    result = size("--list")
    assert result.exit_code == 0
    for name in ("llama-3.1-405b", "mixtral-8x7b", "qwen2.5-72b"):
        assert name in result.output


def test_size_bad_input_exits_non_zero_with_one_line_naming_the_problem(tmp_path):
    _one_line_error(size("llama-9"), "MODEL: unknown model 'llama-9'")
    _one_line_error(size("llama-3-70b", "--context", "128K"),
                    "--context: 131072 tokens is longer than llama-3-70b supports")
    _one_line_error(size("llama-3-70b", "--task", "qlora", "--weights", "bf16"), "--weights:")
    _one_line_error(size("llama-3-70b", "--task", "pretrain"), "--task 'pretrain': choose one of 'serve'", code=2)
    _one_line_error(size("llama-3-70b", "--context", "lots"), "--context 'lots'")
    _one_line_error(size("llama-3-70b", "--context", "inf"), "--context 'inf'")
    _one_line_error(size("llama-3-70b", "--price", "H100"), "--price 'H100'")
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    _one_line_error(size(str(bad)), "MODEL:", "not valid JSON")
    _one_line_error(size(str(tmp_path / "nope.json")), "MODEL: cannot read")


def _client() -> httpx.AsyncClient:
    # The lifespan (NATS, Redis) never starts: sizing needs no state.
    app_, _ = build(SchedulerSettings())
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app_), base_url="http://scheduler")


async def test_post_size_answers_the_report():
    async with _client() as client:
        r = await client.post("/v1/size", json={"model": "llama-3-70b", "task": "qlora", "context": 8192})
    assert r.status_code == 200
    body = r.json()
    assert body["summary"].startswith("QLoRA llama-3-70b @ 8K: 1x H100 fits")
    assert body["options"] and body["prices"]["H100"]["reference"] is True


async def test_post_size_accepts_config_json_contents():
    from tests.test_sizing import LLAMA3_8B_CONFIG

    async with _client() as client:
        r = await client.post("/v1/size", json={"config": LLAMA3_8B_CONFIG, "context": 8192})
    assert r.status_code == 200 and r.json()["model"]["total_params"] == 8_030_261_248


async def test_post_size_bad_input_gets_400_or_422_naming_the_field():
    async with _client() as client:
        unknown = await client.post("/v1/size", json={"model": "llama-9"})
        too_long = await client.post("/v1/size", json={"model": "llama-3-70b", "context": 131072})
        bad_type = await client.post("/v1/size", json={"model": "llama-3-70b", "task": "pretrain"})
        bad_config = await client.post("/v1/size", json={"config": {"hidden_size": 4096}})
    assert unknown.status_code == 400 and unknown.json()["field"] == "model"
    assert "unknown model 'llama-9'" in unknown.json()["detail"]
    assert too_long.status_code == 400 and too_long.json()["field"] == "context"
    assert bad_type.status_code == 422 and bad_type.json()["detail"][0]["loc"] == ["body", "task"]
    assert bad_config.status_code == 400 and "missing num_hidden_layers" in bad_config.json()["detail"]


def test_a_job_naming_a_model_gets_its_memory_figure_from_the_estimate():
    from whaleflux.scheduler.api import SubmitRequest
    from whaleflux.shared.sizing import SizingRequest, memory_floor_mib

    sizing = SizingRequest(model="llama-3-70b", task="qlora", context=8192)
    fields = SubmitRequest(name="ft", command=["python", "train.py"], gpus=2, sizing=sizing).job_fields()
    assert "sizing" not in fields
    assert fields["min_memory_mib"] == -(-memory_floor_mib(sizing, 2) // 1)
    assert 20 * 1024 < fields["min_memory_mib"] < 40 * 1024  # QLoRA 70B @ 8K split over two GPUs
    given = SubmitRequest(name="ft", command=["x"], min_memory_mib=1000, sizing=sizing).job_fields()
    assert given["min_memory_mib"] == 1000  # an explicit figure wins


async def test_submit_with_a_bad_sizing_is_refused_before_anything_is_published():
    settings = SchedulerSettings(admin_token="t" * 32)
    app_, _ = build(settings)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app_), base_url="http://scheduler") as client:
        r = await client.post(
            "/v1/jobs",
            json={"name": "x", "command": ["true"], "sizing": {"model": "llama-3-70b", "context": 131072}},
            headers={"Authorization": "Bearer " + "t" * 32},
        )
    assert r.status_code == 400 and r.json()["field"] == "context"
