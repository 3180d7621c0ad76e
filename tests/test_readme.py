"""The README's examples work as written: every command of a block marked `<!-- tested -->` runs against `whaleflux up`,
in the README and then in the getting-started guide (docs/getting-started.md), where the longer walkthroughs live.

In a `console` block the lines starting with `$ ` are commands; a command whose
next line in the README starts with `error:` must fail with that error, any
other must succeed. In an `sh` block every line is a command (a trailing
backslash continues it). The README's example job id stands for the job the
first example submits; a command with a `<placeholder>` (outside its comment) is skipped.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from .processes import wait_until
from .rootjobs import reachable_folder

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# The files whose marked blocks run, in this order: the README's first job is the first example of all.
TESTED_FILES = (README, ROOT / "docs" / "getting-started.md")
EXAMPLE_JOB = "557e178c3f02"
# The first job's cost lines (whaleflux/commands/jobs.py `show_cost`): its charge, then the job's cost.
CHARGE_SHAPE = re.compile(r"^charged: [\d.]+ GPU-s on \d+x \S+ at \$([\d,.]+)/GPU-h = \$([\d,.]+)$")
COST_SHAPE = re.compile(r"^cost: \$[\d,.]+$")
SERVICES = ("telemetry", "scheduler", "alerting", "billing", "inventory")


@dataclass
class Example:
    line: int | str  # its line, "docs/getting-started.md:12" once all_examples() read it
    command: str
    error: str | None  # the error line the README shows after it, if any


def examples(text: str) -> list[Example]:
    """The commands of the README's marked blocks, in order."""
    lines = text.splitlines()
    out: list[Example] = []
    i = 0
    while i < len(lines):
        if lines[i].startswith("<!-- tested") and i + 1 < len(lines) and lines[i + 1].startswith("```"):
            kind = lines[i + 1][3:].strip()
            j = i + 2
            block: list[tuple[int, str]] = []
            while not lines[j].startswith("```"):
                block.append((j + 1, lines[j]))
                j += 1
            if kind == "console":
                for k, (n, line) in enumerate(block):
                    if line.startswith("$ "):
                        after = block[k + 1][1] if k + 1 < len(block) else ""
                        out.append(Example(n, line[2:], after if after.startswith("error:") else None))
            else:
                pending = ""
                for n, line in block:
                    pending += line.rstrip("\\").rstrip() + " " if line.endswith("\\") else line
                    if not line.endswith("\\") and pending.strip():
                        out.append(Example(n, pending.strip(), None))
                        pending = ""
            i = j
        i += 1
    return out


def all_examples() -> list[Example]:
    """The marked examples of every tested file, in order, each with its file and line."""
    out = []
    for path in TESTED_FILES:
        for ex in examples(path.read_text()):
            ex.line = f"{path.relative_to(ROOT)}:{ex.line}"
            out.append(ex)
    return out


def test_the_marked_blocks_hold_the_examples_a_new_user_tries_first():
    first = examples(README.read_text())
    assert first and first[0].command.startswith("whaleflux submit") and "--wait" in first[0].command, \
        "the README's first marked example is the first job"
    assert any(c.command.startswith("whaleflux alerts") for c in first), "the README shows the first alert"
    assert any(c.command.startswith("whaleflux costs") for c in first), "the README shows the first cost report"
    commands = [e.command for e in all_examples()]
    assert any(c.startswith("whaleflux costs tco") for c in commands)
    assert any(c.startswith("whaleflux sim clear") for c in commands), "the fault demo undoes itself"
    assert any(c.startswith("whaleflux nodes undrain") for c in commands)
    assert len(commands) >= 25  # the 26 examples of the README before it moved to docs/ (issue 37), and more


def _login_path() -> str:
    """The PATH of a terminal that has not activated the venv (how `scripts/dev.py run` starts `up`)."""
    venv_bin = str(Path(sys.prefix) / "bin")
    return os.pathsep.join(p for p in os.environ.get("PATH", os.defpath).split(os.pathsep)
                           if p and p not in (venv_bin, str(Path(sys.executable).parent)))


@contextmanager
def running_up(tmp_path: Path, home: Path, as_user: list[str] | None = None) -> Iterator[dict[str, str]]:
    """`whaleflux up` with WHALEFLUX_HOME `home`, started (by `as_user`, a command prefix, as another user) as a new
    user starts it: no job user, no root allowance, the terminal's PATH without the venv. Yields the environment
    of the other terminal, where the user ran `source .venv/bin/activate`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WHALEFLUX_", "NATS_", "REDIS_"))}
    env["WHALEFLUX_HOME"] = str(home)
    env["COLUMNS"] = "200"
    if as_user:
        env["HOME"] = str(home.parent)  # the other user's own
    up_env = {**env, "PATH": _login_path()}
    shell_env = {**env, "PATH": f"{Path(sys.prefix) / 'bin'}{os.pathsep}{_login_path()}"}  # `whaleflux` as installed
    with open(tmp_path / "up.out", "wb") as out_file:
        up = subprocess.Popen([*(as_user or []), sys.executable, "-m", "whaleflux", "up"], env=up_env,
                              stdout=out_file, stderr=subprocess.STDOUT)
    try:
        def all_ready():
            if up.poll() is not None:
                return True  # said below
            config = home / "config.json"
            services = json.loads(config.read_text())["services"] if config.exists() else {}
            return set(SERVICES) <= set(services) and all(
                httpx.get(services[s] + "/readyz", timeout=1).status_code == 200 for s in SERVICES)

        wait_until(all_ready, timeout=180, what="all five services ready")
        assert up.poll() is None, f"up exited {up.returncode}:\n{(tmp_path / 'up.out').read_text()[-2000:]}"
        yield shell_env
    finally:
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(60)
        except subprocess.TimeoutExpired:
            up.kill()
            up.wait()


def test_every_marked_readme_example_works_against_up(tmp_path):
    # No overrides (issue 37): as root, `up` runs jobs as root; `python` is the venv's, from `up`'s own PATH.
    home = tmp_path / "home"
    with running_up(tmp_path, home) as env:
        job_id = None
        failures = []
        charges: list[str] = []  # what the README's first `--wait` printed about its cost, as this run printed it
        for ex in all_examples():
            if re.search(r"<[a-z-]+>", ex.command.split(" #")[0]):
                continue
            command = ex.command.replace(EXAMPLE_JOB, job_id) if job_id else ex.command
            done = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
                                  timeout=300)
            said = done.stdout + done.stderr
            if job_id is None and (m := re.search(r"submitted job (\w+)", done.stdout)):
                job_id = m.group(1)
                charges = [line for line in done.stdout.splitlines() if line.startswith(("charged:", "cost:"))]
            if ex.error:
                ok = done.returncode != 0 and ex.error.split(":")[0] in said and ex.error.split(": ", 1)[1][:40] in said
            else:
                ok = done.returncode == 0
            if not ok:
                failures.append(f"{ex.line}: {command!r} exited {done.returncode}:\n{said[-1500:]}")
        assert job_id, "the first example submits a job"
        assert not failures, "\n\n".join(failures)
        # The README's cost lines are what a run prints: the same lines, a rate that is a price (never $0.0000 nor
        # "no price"), the job's cost the charge's amount.
        shown = [line for line in README.read_text().splitlines() if line.startswith(("charged:", "cost:"))][:2]
        for lines in (shown, charges):
            assert [CHARGE_SHAPE.match(line) is not None for line in lines] == [True, False], lines
            assert [COST_SHAPE.match(line) is not None for line in lines] == [False, True], lines
            rate, amount = CHARGE_SHAPE.match(lines[0]).groups()  # type: ignore[union-attr]
            assert float(rate.replace(",", "")) > 0 and lines[1] == f"cost: ${amount}", lines
        _first_job_runs_as(env, home, os.geteuid())


# The README's first job, printing who ran it and which Python.
FIRST_JOB = "whaleflux submit --gpus 1 --wait -- python -c 'import os, sys; print(os.getuid(), sys.prefix)'"


def _first_job_runs_as(env: dict[str, str], home: Path, uid: int, as_user: list[str] | None = None) -> None:
    """The first job, submitted by `as_user`, ran as `uid` with the `python` of `up`'s own environment."""
    done = subprocess.run([*(as_user or []), "bash", "-c", FIRST_JOB], cwd="/", env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    job_id = re.search(r"submitted job (\w+)", done.stdout)
    assert job_id, done.stdout
    log = home / "jobs" / f"{job_id.group(1)}.1.log"
    assert log.read_text().split() == [str(uid), sys.prefix], log.read_text()


@pytest.mark.skipif(os.geteuid() != 0, reason="not root: the test above already ran `up` as an ordinary user")
def test_the_first_job_works_when_an_ordinary_user_starts_up(tmp_path):
    """`nobody`, with a HOME of its own, starts `up` and submits the first job: it runs as nobody, with the venv's
    python, from `up`'s PATH alone."""
    nobody = pwd.getpwnam("nobody")
    as_nobody = ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups"]
    probe = "import os, sys, whaleflux.local; print(sys.version, os.__file__)"
    ours = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    theirs = subprocess.run([*as_nobody, sys.executable, "-c", probe], capture_output=True, text=True)
    if theirs.stdout != ours.stdout:  # e.g. a venv made from a Python under /root (0700): not usable by others
        pytest.skip(f"nobody cannot use the Python of {sys.prefix} as this user does: {ours.stdout.strip()!r} here,"
                    f" {(theirs.stdout + theirs.stderr).strip()[-300:]!r} as nobody")
    own = reachable_folder(tmp_path, "nobody-home")
    own.mkdir()
    os.chown(own, nobody.pw_uid, nobody.pw_gid)
    home = own / "whaleflux"
    with running_up(tmp_path, home, as_nobody) as env:
        _first_job_runs_as(env, home, nobody.pw_uid, as_nobody)


