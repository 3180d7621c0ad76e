"""One truth on every surface, through `whaleflux up`: a job's cost reads the same from the API, the CLI and the
console (a running job's cost so far, marked as such)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from html import unescape

import httpx
import pytest

from whaleflux.shared import money

from .processes import wait_until
from .rootjobs import ROOT_JOBS

SERVICES = ("telemetry", "scheduler", "alerting", "billing", "inventory")
COST = re.compile(r"^cost: (.+)$", re.MULTILINE)
RATE = re.compile(r"^charged: .* at (.+?) = ", re.MULTILINE)


@dataclass
class Up:
    env: dict[str, str]
    services: dict[str, str]
    console: httpx.Client

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([sys.executable, "-m", "whaleflux", *args], env=self.env, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        return done

    def api(self, service: str, path: str) -> httpx.Response:
        return httpx.get(self.services[service] + path, timeout=10)


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    tmp = tmp_path_factory.mktemp("truth")
    home = tmp / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WHALEFLUX_", "NATS_", "REDIS_"))} | ROOT_JOBS
    env["WHALEFLUX_HOME"] = str(home)
    with open(tmp / "up.out", "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "whaleflux", "up"], env=env, stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        config = home / "config.json"

        def all_ready() -> bool:
            services = json.loads(config.read_text())["services"]
            return {*SERVICES, "console"} <= set(services) and all(
                httpx.get(services[s] + "/readyz", timeout=1).status_code == 200 for s in SERVICES)

        wait_until(all_ready, timeout=180, what="all five services ready")
        cfg = json.loads(config.read_text())
        with httpx.Client(base_url=cfg["services"]["console"], timeout=30) as client:
            wait_until(lambda: client.get("/login").status_code == 200, what="console up")
            csrf = re.search(r'name="csrf" value="([^"]+)"', client.get("/login").text)
            assert csrf is not None
            done = client.post("/login", data={"token": cfg["admin_token"], "csrf": csrf[1], "next": "/jobs"},
                               follow_redirects=False)
            assert done.status_code == 303, done.text
            yield Up(env, cfg["services"], client)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _console_cost(up: Up, job_id: str) -> tuple[str, list[str]]:
    """The job page's cost and its attempts' $/GPU-h cells."""
    html = up.console.get(f"/jobs/{job_id}").text
    found = re.search(r'data-testid="job-cost">([^<]*)<', html)
    assert found, html
    rates = re.findall(r'<td class="n">([^<]*(?:/GPU-h|no price))</td>', html)
    return unescape(found[1]), [unescape(r) for r in rates]


def _amount(text: str) -> Decimal:
    return Decimal(text.split()[0].split("/")[0].lstrip("$").replace(",", ""))


def test_a_jobs_cost_is_one_figure_on_the_api_the_cli_and_the_console_running_and_ended(up: Up) -> None:
    submitted = up.cli("submit", "--model", "H100", "--", "sleep", "300").stdout
    job_id = submitted.split("submitted job ")[1].split()[0]
    wait_until(lambda: up.api("billing", f"/v1/costs/jobs/{job_id}").status_code == 200, timeout=60,
               what="billing charging the running job")

    # Running: each surface shows the cost so far, marked; read between two reads of the API, it lies between
    # them (the cost grows while the job runs), in the API's own digits.
    before = up.api("billing", f"/v1/costs/jobs/{job_id}").json()
    shown = up.cli("jobs", "show", job_id).stdout
    page, page_rates = _console_cost(up, job_id)
    after = up.api("billing", f"/v1/costs/jobs/{job_id}").json()
    assert all(r["so_far"] and r["ended_at"] is None for r in before + after)
    lo, hi = _amount(money.job_cost(before)), _amount(money.job_cost(after))
    assert Decimal(0) < lo <= hi, (before, after)
    cli_cost = COST.findall(shown)
    assert len(cli_cost) == 1 and cli_cost[0].endswith(" so far (running)"), shown
    assert page.endswith(" so far (running)"), page
    for figure in (cli_cost[0], page):
        assert lo <= _amount(figure) <= hi, (figure, lo, hi)
        assert figure == money.job_usd(_amount(figure)) + " so far (running)"  # billing's digits, not cents
    # The rate: the GPU's price, the same on every surface (the H100s of the demo fleet are owned, amortized).
    rate = money.gpu_hour_rate(after[0]["usd_per_gpu_hour"])
    assert rate != money.NO_PRICE and RATE.findall(shown) == [rate] and page_rates == [rate], (shown, page_rates)

    # Ended: the very same string everywhere.
    up.cli("jobs", "cancel", job_id)
    wait_until(lambda: all(r["ended_at"] for r in up.api("billing", f"/v1/costs/jobs/{job_id}").json()),
               timeout=60, what="billing closing the cancelled job's charge")
    final = up.api("billing", f"/v1/costs/jobs/{job_id}").json()
    figure = money.job_cost(final)
    assert "so far" not in figure and _amount(figure) >= hi
    assert figure == "$" + final[0]["cost_usd"]
    assert COST.findall(up.cli("jobs", "show", job_id).stdout) == [figure]
    assert _console_cost(up, job_id) == (figure, [rate])


def test_every_gpu_model_of_the_demo_fleet_has_a_price(up: Up) -> None:
    """A short job on each model: its charge names a rate, never "$0.0000/GPU-h" (the rounded cost of a job of a
    tenth of a second over its time); billing's rate is the GPU's price."""
    for model in ("RTX4090", "A100", "H100", "H200"):
        done = up.cli("submit", "--wait", "--model", model, "--", "true").stdout
        rates = RATE.findall(done)
        assert len(rates) == 1 and rates[0] != money.NO_PRICE, done
        assert _amount(rates[0]) > 0, done
        job_id = done.split("submitted job ")[1].split()[0]
        [line] = up.api("billing", f"/v1/costs/jobs/{job_id}").json()
        assert rates[0] == money.gpu_hour_rate(line["usd_per_gpu_hour"])
        assert COST.findall(done) == [money.job_cost([line])]


STATES = ("free", "allocated", "quarantined", "draining")


def _scheduler_counts(up: Up) -> dict[str, int]:
    rows = up.api("scheduler", "/v1/gpus").json()
    return {state: sum(1 for g in rows if g["status"] == state) for state in STATES}


def _cli_counts(up: Up) -> dict[str, int]:
    """The count line under `gpus list`: "27 free, 1 allocated, 1 quarantined, 8 draining"."""
    last = up.cli("gpus", "list").stdout.strip().splitlines()[-1]
    said = {word: int(n) for n, word in (part.split() for part in last.split(", "))}
    return {state: said.get(state, 0) for state in STATES}


def _inventory_counts(up: Up) -> dict[str, int]:
    rows = up.api("inventory", "/v1/inventory").json()
    return {state: sum(r[state] for r in rows) for state in ("free", "allocated", "quarantined", "draining")}


def _console_counts(up: Up) -> dict[str, int]:
    html = up.console.get("/fleet").text
    out = {}
    for state in ("free", "quarantined", "draining"):
        found = re.search(rf'data-testid="gpus-{state}">(\d+)<', html)
        assert found, html
        out[state] = int(found[1])
    return out


def _findings_free(up: Up) -> dict[str, int]:
    """model -> free GPUs as the capacity finding says ("3/4 RTX4090 GPUs free in dev"; absent: none free)."""
    [capacity] = [f for f in up.api("inventory", "/v1/findings").json() if f["kind"] == "capacity"]
    return {model: int(free) for free, _, model in re.findall(r"(\d+)/(\d+) (\S+) GPUs free", capacity["summary"])}


def test_quarantined_draining_and_free_gpus_are_counted_alike_by_the_cli_the_console_inventory_and_findings(
        up: Up) -> None:
    up.cli("gpus", "cordon", "r4090-01", "2", "--reason", "one truth")
    up.cli("nodes", "drain", "a100-01", "--reason", "one truth")
    try:
        def agree() -> bool:
            truth = _scheduler_counts(up)
            if truth["quarantined"] != 1 or truth["draining"] != 8:
                return False
            rows = up.api("scheduler", "/v1/gpus").json()
            per_model = {m: sum(1 for g in rows if g["model"] == m and g["status"] == "free")
                         for m in ("RTX4090", "A100", "H100", "H200")}
            findings = _findings_free(up)
            return (_cli_counts(up) == truth and _inventory_counts(up) == truth
                    and _console_counts(up) == {s: truth[s] for s in ("free", "quarantined", "draining")}
                    and {m: findings.get(m, 0) for m in per_model} == per_model)

        wait_until(agree, timeout=60, what="every surface counting 1 quarantined and 8 draining GPUs alike")
        # The drained A100 node has no free GPU anywhere: findings do not offer its 8 GPUs as free capacity.
        assert "A100" not in _findings_free(up)
        assert _inventory_counts(up)["free"] == _scheduler_counts(up)["free"]
    finally:
        up.cli("nodes", "undrain", "a100-01")
        up.cli("gpus", "uncordon", "r4090-01", "2")
    wait_until(lambda: _scheduler_counts(up)["draining"] == 0 and _inventory_counts(up)["draining"] == 0
               and _inventory_counts(up)["quarantined"] == 0, timeout=60, what="undrained and uncordoned everywhere")
