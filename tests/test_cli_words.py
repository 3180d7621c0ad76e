"""Every option of the CLI, fed bad values: the error names the option in the user's words (allowed values, date
formats), never pydantic's text or a traceback, and the command exits non-zero.

The options are read from the typer app itself, so a new option is covered without touching this file: it must
refuse the bad values below, or be declared free text (any value is valid) in FREE. The services' addresses point
at a closed port, so an option passed on unchecked ends in "cannot reach", which names no option and fails here:
every option is checked before any call. How the CLI words a service's own refusal (422) is tested below too, on
the answers FastAPI gives.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from datetime import datetime
from typing import Any, Literal

import pytest
import typer
from fastapi import FastAPI, Query
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from whaleflux.cli import app
from whaleflux.client import refusal_in_words

BAD_VALUES = ("foo", "tomorrow", "-1", "", "nan")
PYDANTIC_TEXT = ("validation error", "Input should be", "type=", "pydantic", "errors.pydantic.dev")

# Options whose every value is valid: names, free text, filters the service answers "none" to, output paths.
FREE = {
    ("alerts", "ack"): {"--by", "--comment"},
    ("alerts", "notifications"): {"--receiver"},
    ("alerts", "silence", "add"): {"--comment", "--author"},
    ("jobs", "cancel"): {"--reason"},
    ("jobs", "logs"): {"--node"},  # the job's nodes are named in the error, when the job is known
    ("gpus", "list"): {"--node"},
    ("gpus", "cordon"): {"--reason"},
    ("nodes", "drain"): {"--reason"},
    ("monitor",): {"--node"},
    ("sim", "inject"): {"--node"},  # the agent knows its nodes, and names them
    ("submit",): {"--name", "--team", "--project", "--workdir", "--checkpoint-dir", "--service"},
    ("schemas",): {"--out"},
    ("simulate",): {"--jobs-out"},
    ("trace", "prepare"): {"--output"},
    ("test-gpu",): {"--report"},
    ("tokens", "issue"): {"--name", "--team", "--service"},
}

# What each command needs besides the option under test (its arguments and required options), all valid.
BASE: dict[tuple[str, ...], list[str]] = {
    ("jobs", "show"): ["j-1"],
    ("jobs", "why"): ["j-1"],
    ("jobs", "cancel"): ["j-1"],
    ("jobs", "logs"): ["j-1"],
    ("gpus", "cordon"): ["h100-01", "0"],
    ("gpus", "uncordon"): ["h100-01", "0"],
    ("nodes", "drain"): ["h100-01"],
    ("nodes", "undrain"): ["h100-01"],
    ("alerts", "ack"): ["abc"],
    ("alerts", "silence", "add"): ["alertname=GPUTemperatureHigh", "--comment", "test"],
    ("alerts", "silence", "expire"): ["s-1"],
    ("costs", "tco"): ["--model", "H100"],
    ("sim", "inject"): ["cooling", "--node", "h100-01", "--gpu", "0"],
    ("submit",): ["--", "true"],
    ("service",): ["scheduler"],
    ("tokens", "issue"): ["--name", "ci"],
    ("tokens", "revoke"): ["ci"],
    ("size",): ["llama-3-8b"],
    ("simulate",): ["--jobs", "jobs.csv"],  # written by the fixture
    ("trace", "prepare"): ["trace.csv", "--format", "generic"],  # a small trace, written by the fixture
}


def commands(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every command and group of the app (typer's own click), with the words that invoke it."""
    if path:
        yield path, command
    if hasattr(command, "commands"):
        for name, sub in command.commands.items():
            yield from commands(sub, (*path, name))


def options() -> list[tuple[tuple[str, ...], str]]:
    """(command path, option) for every option that takes a value and is not free text."""
    found = []
    for path, command in commands(typer.main.get_command(app)):
        for param in command.params:
            if param.param_type_name != "option" or param.is_flag or param.name == "help":
                continue
            flag = max(param.opts, key=len)
            if flag not in FREE.get(path, set()):
                found.append((path, flag))
    return found


COMMAND = typer.main.get_command(app)  # built once: typer builds it anew on every CliRunner.invoke (70 ms)


def invoke(args: list[str]) -> tuple[int, str]:
    """Run `whaleflux ARGS` in this process: (exit code, stdout and stderr as one). An exception other than an exit
    is a crash, and propagates with its traceback."""
    with CliRunner().isolation() as (_, _, output):
        try:
            COMMAND.main(args=args, prog_name="whaleflux")
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        return code, output.getvalue().decode(errors="replace")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def no_services(tmp_path, monkeypatch):
    """No service answers; the CLI's files live in tmp_path (which is also the working directory)."""
    url = f"http://127.0.0.1:{closed_port()}"
    for name in ("telemetry", "scheduler", "alerting", "billing", "inventory", "agent"):
        monkeypatch.setenv(f"WHALEFLUX_{name.upper()}_URL", url)
    monkeypatch.setenv("NATS_URL", f"nats://127.0.0.1:{closed_port()}")
    monkeypatch.setenv("WHALEFLUX_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("WHALEFLUX_TOKEN", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "jobs.csv").write_text("job_id,submit_time_s,duration_s,num_gpus\nj1,0,60,1\n")
    (tmp_path / "trace.csv").write_text("job_id,submission_time,duration,num_gpu\nj1,0,600,1\nj2,60,900,2\n")


def test_the_options_are_found():
    found = options()
    assert (("jobs",), "--state") in found
    assert (("costs",), "--from") in found
    assert len(found) > 40


@pytest.mark.parametrize(("path", "flag"), options(), ids=lambda x: " ".join(x) if isinstance(x, tuple) else x)
def test_a_bad_value_is_refused_naming_the_option(no_services, path, flag):
    refused = []
    for bad in BAD_VALUES:
        base = BASE.get(path, [])
        # After the base's options (the last of an option given twice counts), before a job's command (`-- true`).
        cut = base.index("--") if "--" in base else len(base)
        args = [*path, *base[:cut], f"{flag}={bad}", *base[cut:]]
        code, out = invoke(args)
        shown = f"`whaleflux {' '.join(args)}` printed:\n{out}"
        if code == 0:
            continue  # a value this option takes, done without a service (e.g. a local estimate)
        refused.append(bad)
        assert "Traceback" not in out, shown
        assert not [t for t in PYDANTIC_TEXT if t in out], shown
        assert flag in out, f"the error does not name {flag}: {shown}"
    assert refused, f"whaleflux {' '.join(path)} {flag} took every one of {BAD_VALUES}"


def test_dates_are_explained_with_the_formats_and_an_example(no_services):
    code, out = invoke(["costs", "--from", "tomorrow"])
    assert code != 0
    assert "--from 'tomorrow'" in out
    assert "YYYY-MM-DD" in out and "e.g. 2026-12-01" in out


def test_a_state_is_refused_with_the_states_there_are(no_services):
    code, out = invoke(["jobs", "--state", "foo"])
    assert code != 0
    assert "--state 'foo': choose one of pending, placed, running, succeeded" in out


def test_a_services_refusal_names_the_option_and_what_it_takes():
    """The 422 FastAPI answers for a query parameter, in words: the option, the allowed values or the formats."""
    api = FastAPI()

    @api.get("/v1/jobs")
    def jobs(state: Literal["pending", "running"] | None = None, limit: int = Query(100, ge=1),
             start: datetime | None = Query(None, alias="from")) -> list[str]:
        return []

    client = TestClient(api)
    for query, words in [
        ({"state": "foo"}, "--state 'foo': choose one of 'pending', 'running'"),
        ({"limit": "x"}, "--limit 'x': expected a whole number"),
        ({"limit": "0"}, "--limit '0': must be at least 1"),
        ({"from": "tomorrow"}, "--from 'tomorrow': expected a date"),
    ]:
        resp = client.get("/v1/jobs", params=query)
        assert resp.status_code == 422
        message = refusal_in_words("scheduler", resp.json()["detail"])
        assert words in message, message
        assert not [t for t in PYDANTIC_TEXT if t in message], message


def test_the_choices_the_cli_checks_are_the_services_own():
    """The CLI refuses a value before any call, so its lists must be the services' (a drift fails here)."""
    import typing

    from whaleflux.alerting.delivery.model import LogEntry
    from whaleflux.billing.api import GroupBy
    from whaleflux.commands.alerts import NOTIFICATION_STATUSES
    from whaleflux.commands.costs import GROUPINGS
    from whaleflux.commands.jobs import JOB_STATES
    from whaleflux.scheduler.records import JobStateName

    assert JOB_STATES == typing.get_args(JobStateName)
    assert set(NOTIFICATION_STATUSES) == {*typing.get_args(LogEntry.model_fields["status"].annotation), "pending"}
    assert typing.get_args(GroupBy) == GROUPINGS
