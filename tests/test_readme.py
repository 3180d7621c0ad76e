"""The README's examples work as written: every command of a block marked `<!-- tested -->` runs against `whaleflux up`.

In a `console` block the lines starting with `$ ` are commands; a command whose
next line in the README starts with `error:` must fail with that error, any
other must succeed. In an `sh` block every line is a command (a trailing
backslash continues it). The README's example job id stands for the job the
first example submits; a command with a `<placeholder>` (outside its comment) is skipped.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx

from .processes import wait_until
from .rootjobs import ROOT_JOBS

README = Path(__file__).resolve().parents[1] / "README.md"
EXAMPLE_JOB = "557e178c3f02"
SERVICES = ("telemetry", "scheduler", "alerting", "billing", "inventory")


@dataclass
class Example:
    line: int
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


def test_the_marked_blocks_hold_the_examples_a_new_user_tries_first():
    found = examples(README.read_text())
    commands = [e.command for e in found]
    assert any(c.startswith("whaleflux submit") and "--wait" in c for c in commands)
    assert any(c.startswith("whaleflux costs tco") for c in commands)
    assert len(found) >= 15


def test_every_marked_readme_example_works_against_up(tmp_path):
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WHALEFLUX_", "NATS_", "REDIS_"))} | ROOT_JOBS
    env["WHALEFLUX_HOME"] = str(home)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # `whaleflux` as installed
    env["COLUMNS"] = "200"
    with open(tmp_path / "up.out", "wb") as out_file:
        up = subprocess.Popen([sys.executable, "-m", "whaleflux", "up"], env=env, stdout=out_file,
                              stderr=subprocess.STDOUT)
    try:
        def all_ready():
            services = json.loads((home / "config.json").read_text())["services"]
            return set(SERVICES) <= set(services) and all(
                httpx.get(services[s] + "/readyz", timeout=1).status_code == 200 for s in SERVICES)

        wait_until(all_ready, timeout=180, what="all five services ready")
        job_id = None
        failures = []
        for ex in examples(README.read_text()):
            if re.search(r"<[a-z-]+>", ex.command.split(" #")[0]):
                continue
            command = ex.command.replace(EXAMPLE_JOB, job_id) if job_id else ex.command
            done = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
                                  timeout=300)
            said = done.stdout + done.stderr
            if job_id is None and (m := re.search(r"submitted job (\w+)", done.stdout)):
                job_id = m.group(1)
            if ex.error:
                ok = done.returncode != 0 and ex.error.split(":")[0] in said and ex.error.split(": ", 1)[1][:40] in said
            else:
                ok = done.returncode == 0
            if not ok:
                failures.append(f"README.md:{ex.line}: {command!r} exited {done.returncode}:\n{said[-1500:]}")
        assert job_id, "the first example submits a job"
        assert not failures, "\n\n".join(failures)
    finally:
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(60)
        except subprocess.TimeoutExpired:
            up.kill()
            up.wait()
