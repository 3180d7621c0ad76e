"""Errors in the user's words: the flag named, the allowed values listed, a hint for the likely cause."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import typing

from whaleflux.commands.submit import Priority, Workload
from whaleflux.shared.catalog import gpu_models
from whaleflux.shared.events import JobSubmitted


def _cli(tmp_path, *args: str) -> subprocess.CompletedProcess:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WHALEFLUX_", "NATS_", "REDIS_"))}
    env.update(WHALEFLUX_HOME=str(tmp_path / "home"), NATS_URL=f"nats://127.0.0.1:{closed}",
               WHALEFLUX_SCHEDULER_URL=f"http://127.0.0.1:{closed}", COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "whaleflux", *args], env=env, capture_output=True, text=True,
                          timeout=120)


def _choices(field: str) -> list[str]:
    return list(typing.get_args(JobSubmitted.model_fields[field].annotation))


def test_the_cli_offers_exactly_the_choices_of_the_job_contract():
    assert [w.value for w in Workload] == _choices("workload_class")
    assert [p.value for p in Priority] == _choices("priority")


def test_a_bad_choice_names_the_flag_and_lists_the_allowed_values(tmp_path):
    out = _cli(tmp_path, "submit", "--priority", "urgent", "--", "true")
    assert out.returncode == 2
    assert "--priority" in out.stderr and all(f"'{p}'" in out.stderr for p in _choices("priority"))
    assert "validation error" not in out.stderr + out.stdout and "literal_error" not in out.stderr + out.stdout
    out = _cli(tmp_path, "submit", "--workload", "foo", "--", "true")
    assert out.returncode == 2 and "--workload" in out.stderr and "workload_class" not in out.stderr
    assert all(f"'{w}'" in out.stderr for w in _choices("workload_class"))


def test_choices_and_model_names_take_any_case_and_an_unknown_model_is_called_unknown(tmp_path):
    # Everything valid, in odd case: it gets as far as the bus (nothing runs here), past every check.
    ok = _cli(tmp_path, "submit", "--priority", "HIGH", "--workload", "FineTune", "--model", "h100",
              "--model", "rtx 4090", "--retry-for", "0", "--", "true")
    assert ok.returncode == 1 and "cannot reach NATS" in ok.stdout, ok.stdout + ok.stderr
    unknown = _cli(tmp_path, "submit", "--model", "b200", "--", "true")
    assert unknown.returncode == 2
    assert f"--model 'b200': unknown GPU model; choose one of {', '.join(sorted(gpu_models()))}" in unknown.stdout


def test_a_bad_field_value_names_the_flag_not_the_field(tmp_path):
    out = _cli(tmp_path, "submit", "--team", "bad team!", "--", "true")
    assert out.returncode == 1 and out.stdout.startswith("error: --team 'bad team!':"), out.stdout
    assert "JobSubmitted" not in out.stdout


def test_a_job_command_with_options_but_no_double_dash_gets_a_hint(tmp_path):
    out = _cli(tmp_path, "submit", "python", "-c", "print(1)")
    assert out.returncode == 2 and "No such option: -c" in out.stderr
    assert "hint: put the job's command after `--`" in out.stderr
    fine = _cli(tmp_path, "submit", "--retry-for", "0", "--", "python", "-c", "print(1)")
    assert "hint" not in fine.stderr


def test_an_unknown_job_is_called_unknown_by_show_why_and_logs(tmp_path):
    # A scheduler that knows no job: a real local HTTP server answering 404 as the scheduler does.
    from whaleflux.servers import QuietHandler, serve_http

    class NoJobs(QuietHandler):
        def do_GET(self):  # noqa: N802
            body = b'{"detail": "job not found"}'
            self.send_response(404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = serve_http(NoJobs)
    try:
        env_url = f"http://127.0.0.1:{server.server_port}"
        for args in (["jobs", "show", "nope123"], ["jobs", "why", "nope123"], ["jobs", "logs", "nope123"]):
            env = {**{k: v for k, v in os.environ.items() if not k.startswith("WHALEFLUX_")},
                   "WHALEFLUX_HOME": str(tmp_path / "home"), "WHALEFLUX_SCHEDULER_URL": env_url}
            out = subprocess.run([sys.executable, "-m", "whaleflux", *args], capture_output=True, text=True,
                                 timeout=120, env=env)
            assert out.returncode == 1 and out.stdout.strip() == "error: no job nope123", (args, out.stdout)
    finally:
        server.shutdown()


def test_an_empty_listing_says_so(tmp_path):
    from whaleflux.servers import QuietHandler, serve_http

    class Empty(QuietHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"[]")

    server = serve_http(Empty)
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("WHALEFLUX_")},
               "WHALEFLUX_HOME": str(tmp_path / "home"), "WHALEFLUX_SCHEDULER_URL": url, "WHALEFLUX_ALERTING_URL": url}
        for args, said in ((["jobs"], "no jobs"), (["jobs", "--state", "running"], "no jobs in state running"),
                           (["alerts"], "no alerts firing")):
            out = subprocess.run([sys.executable, "-m", "whaleflux", *args], env=env, capture_output=True, text=True,
                                 timeout=120)
            assert out.returncode == 0 and out.stdout.strip() == said, (args, out.stdout)
    finally:
        server.shutdown()
