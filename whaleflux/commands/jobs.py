"""`whaleflux jobs`: list jobs, show one (where it ran, how it ended, what it cost), why it waits, its output,
cancel one."""

from __future__ import annotations

import sys
import time
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from whaleflux.client import ClientError, Connection, NotFound
from whaleflux.shared import money

from .terminal import console, fail, one_of, print_table

jobs_app = typer.Typer(help="List jobs, or show one.", invoke_without_command=True)

# Every state of a job (the scheduler's JobStateName), in the order a job passes through them.
JOB_STATES = ("pending", "placed", "running", "succeeded", "failed", "rejected", "cancelled")
TERMINAL = {"succeeded", "failed", "rejected", "cancelled"}
POLL_S = 0.25  # how often `submit --wait` asks the scheduler: the wait ends within this of the job's end
WHY_POLL_S = 2.0  # how often a waiting job's reason is asked for: printed again only when it changes
BILLING_GRACE_S = 5.0  # how long an ended job's charge may take to appear (billing meters from the same events)


@jobs_app.callback()
def jobs(
    ctx: typer.Context,
    state: Annotated[str | None, typer.Option(help="only jobs in this state: " + ", ".join(JOB_STATES))] = None,
) -> None:
    """List jobs, newest first."""
    if ctx.invoked_subcommand:
        return
    one_of("--state", state, JOB_STATES)
    try:
        rows = Connection.discover().get("scheduler", "/v1/jobs", state=state)
    except ClientError as exc:
        fail(str(exc))
    table = Table()
    for col in ("id", "state", "node", "GPUs", "team"):
        table.add_column(col, no_wrap=True)
    table.add_column("name", max_width=24, overflow="ellipsis", no_wrap=True)
    table.add_column("submitted", no_wrap=True)
    table.add_column("reason", overflow="fold")
    for j in rows:
        node = j.get("node") or ""
        if len(j.get("parts") or []) > 1:
            node += f" +{len(j['parts']) - 1}"  # a gang: its rank-0 node and how many more
        table.add_row(
            j["job_id"], j["state"], node, str(j["spec"]["gpus"]), j["spec"]["team"],
            j["spec"]["name"], j["submitted_at"][5:19].replace("T", " "), j.get("reason") or "",
        )
    print_table(table, "no jobs" + (f" in state {state}" if state else ""))


def _get_job(conn: Connection, path: str, job_id: str) -> Any:
    try:
        return conn.get("scheduler", path)
    except NotFound:
        fail(f"no job {job_id}")
    except ClientError as exc:
        fail(str(exc))


@jobs_app.command("show")
def jobs_show(job_id: str) -> None:
    """One job: its spec, where it ran, its exit code and what it cost."""
    conn = Connection.discover()
    j = _get_job(conn, f"/v1/jobs/{job_id}", job_id)
    spec = j["spec"]
    table = Table(show_header=False)
    for key, value in [
        ("id", j["job_id"]), ("name", spec["name"]), ("team / project", f"{spec['team']} / {spec['project']}"),
        ("command", " ".join(spec["command"])), ("state", j["state"]), ("reason", j.get("reason") or ""),
        ("attempt", str(j["attempt"])), ("node", j.get("node") or ""), ("GPU model", j.get("gpu_model") or ""),
        ("GPUs", ", ".join(j["gpu_uuids"])),
        *[(f"rank {p['rank']}", f"{p['node']} ({p['gpu_model']}): {p['state']}"
           + ("" if p.get("exit_code") is None else f", exit code {p['exit_code']}")
           + f", GPUs {', '.join(p['gpu_uuids'])}")
          for p in j.get("parts") or []],
        ("submitted", j["submitted_at"]), ("placed", j.get("placed_at") or ""),
        ("started", j.get("started_at") or ""), ("finished", j.get("finished_at") or ""),
        ("exit code", "" if j.get("exit_code") is None else str(j["exit_code"])),
    ]:
        table.add_row(key, value)
    console.print(table)
    if j["state"] in TERMINAL or j.get("started_at"):
        show_cost(conn, j)


@jobs_app.command("why")
def jobs_why(job_id: str) -> None:
    """Why a job waits (what it needs, the largest free block, jobs ahead), or where and why it runs."""
    answer = _get_job(Connection.discover(), f"/v1/jobs/{job_id}/why", job_id)
    console.print(f"{job_id}: {answer['state']} (attempt {answer['attempt']})")
    console.print(escape(answer["why"]), soft_wrap=True)


@jobs_app.command("cancel")
def jobs_cancel(
    job_id: str,
    reason: Annotated[str, typer.Option(help="why, kept in the job's record")] = "cancelled by an operator",
) -> None:
    """Cancel a job: a pending one leaves the queue, a running one is stopped (SIGTERM, grace, SIGKILL) and ends
    cancelled, never run again. Needs the admin token."""
    try:
        out = Connection.discover().post_admin("scheduler", f"/v1/jobs/{job_id}/cancel", {"reason": reason})
    except ClientError as exc:
        fail(str(exc))
    stopping = f"; stopping it on {', '.join(out['stopping'])}" if out["stopping"] else ""
    console.print(f"{job_id}: cancelled (was {out['was']}, attempt {out['attempt']}){stopping}", soft_wrap=True)


@jobs_app.command("logs")
def jobs_logs(
    job_id: str,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="keep printing new output until the job ends")] = False,
    attempt: Annotated[int | None, typer.Option(min=1, help="which attempt; default the latest")] = None,
    node: Annotated[str | None, typer.Option(help="a gang spanning nodes: this node's part (default rank 0's)")] = None,
    rank: Annotated[int | None, typer.Option(min=0, help="a gang spanning nodes: this rank's part (default 0)")] = None,
) -> None:
    """A job's output. Reads the agent's log files under WHALEFLUX_HOME/jobs, so it works where the agent runs
    (one machine, e.g. `whaleflux up`), not yet for an agent on another host. A gang spanning nodes writes one
    log per node: rank 0's (the coordinator's) by default, another with --rank or --node."""
    from whaleflux.job_logs import follow_log, latest_attempt, log_path

    conn = Connection.discover()
    record: dict[str, Any] = {}
    unknown = False

    def state() -> tuple[str | None, int | None]:
        nonlocal unknown
        try:
            job = conn.get("scheduler", f"/v1/jobs/{job_id}")
            record.update(job)
            return job["state"], job["attempt"] or None
        except NotFound:
            unknown = True
            return None, None
        except ClientError:
            return None, None

    current, known = state()
    if unknown and latest_attempt(job_id) is None:
        fail(f"no job {job_id}")
    if node is not None:
        ranks = {p["node"]: p["rank"] for p in record.get("parts") or []} or {record.get("node"): 0}
        if node not in ranks:
            fail(f"job {job_id} (attempt {known}) has no part on node {node!r}; "
                 f"its nodes: {', '.join(map(str, ranks))}")
        rank = ranks[node]
    rank = rank or 0
    which = attempt or known or latest_attempt(job_id)
    if which is None or not log_path(job_id, which, rank).exists():
        where = log_path(job_id, which or 1, rank).parent
        fail(f"no log for job {job_id} yet under {where}" + (f" (job is {current})" if current else ""))
    if not follow:
        sys.stdout.write(log_path(job_id, which, rank).read_text(errors="replace"))
        return
    follow_log(job_id, which, state, fixed_attempt=attempt is not None, terminal=TERMINAL, rank=rank)


def _where(job: dict[str, Any] | None) -> str:
    """" on NODE GPU UUIDS", or each node of a gang with its GPU count; "" before placement."""
    if job and len(job.get("parts") or []) > 1:
        return " on " + ", ".join(f"{p['node']} ({len(p['gpu_uuids'])} GPUs)" for p in job["parts"])
    return f" on {job['node']} GPU {','.join(job['gpu_uuids'])}" if job and job.get("node") else ""


def wait_for(conn: Connection, job_id: str) -> None:
    """Print each state the job passes through, and while it waits why (once a placement pass has judged it, and
    again whenever the reason changes); when it ends (any end), how it ended and what it cost."""
    last = None
    said: str | None = None  # the key of the reason last printed
    asked = 0.0  # when the scheduler was last asked why (monotonic)
    try:
        while True:
            try:
                job = conn.get("scheduler", f"/v1/jobs/{job_id}")
            except NotFound:
                job = None  # not yet seen by the scheduler
            except ClientError as exc:
                fail(f"{exc}; the job goes on: `whaleflux jobs show {job_id}` later")
            state = job["state"] if job else "submitted"
            if state != last:
                console.print(f"{job_id}: {state}{_where(job)}", soft_wrap=True)
                last = state
            if state == "pending" and job and job.get("reason") and time.monotonic() - asked >= WHY_POLL_S:
                asked = time.monotonic()
                said = _say_why(conn, job_id, said)
            if state in TERMINAL:
                print_end(job)
                show_cost(conn, job, BILLING_GRACE_S)
                raise typer.Exit(0 if state == "succeeded" else 1)
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        console.print(f"stopped waiting; job {job_id} goes on (`whaleflux jobs show {job_id}`)")
        raise typer.Exit(130) from None


def _say_why(conn: Connection, job_id: str, said: str | None) -> str | None:
    """Print why the job waits if the reason changed since `said` (its key); returns the key now. A scheduler that
    does not answer leaves it for the next time."""
    try:
        answer = conn.get("scheduler", f"/v1/jobs/{job_id}/why")
    except ClientError:
        return said
    if answer.get("state") != "pending":
        return said
    key = answer.get("why_key") or answer["why"]
    if key != said:
        console.print(f"{job_id}: {escape(answer['why'])}", soft_wrap=True)
    return str(key)


def exit_status(code: int | None) -> str | None:
    """An exit code in words: "exit code 3", "killed by SIGKILL", "exit code 143 (128 + SIGTERM)"."""
    import signal

    def name(n: int) -> str:
        try:
            return signal.Signals(n).name
        except ValueError:
            return f"signal {n}"

    if code is None:
        return None
    if code < 0:
        return f"killed by {name(-code)}"
    if code > 128 and code - 128 < signal.NSIG:
        return f"exit code {code} (128 + {name(code - 128)})"
    return f"exit code {code}"


def print_end(job: dict[str, Any]) -> None:
    """How an ended job ended: its exit status, each rank's of a gang, and the reason."""
    status = exit_status(job.get("exit_code"))
    if status:
        console.print(status)
    for p in job.get("parts") or []:
        if len(job["parts"]) > 1 and p.get("exit_code") is not None:
            console.print(f"  rank {p['rank']} on {p['node']}: {exit_status(p['exit_code'])}")
    if job.get("reason"):
        console.print(f"reason: {escape(job['reason'])}", soft_wrap=True)


def show_cost(conn: Connection, job: dict[str, Any], wait_s: float = 0.0) -> None:
    """What billing charged for the job, one line per attempt and the job's cost (the same figure the console
    and the API show: shared/money.py); a running job's cost so far, marked. Waits up to `wait_s` for an ended
    job's charge, never for one that never ran."""
    job_id = job["job_id"]
    if not job.get("started_at") and (job.get("attempt") or 0) <= 1:
        console.print("not charged: it never ran")
        return
    ended = job["state"] in TERMINAL
    deadline = time.monotonic() + wait_s
    while True:
        try:
            recs = conn.get("billing", f"/v1/costs/jobs/{job_id}")
        except NotFound:
            recs = []
        except ClientError as exc:
            console.print(f"charge: not known ({exc})", soft_wrap=True)
            return
        if recs and (not ended or all(r.get("ended_at") for r in recs)):
            for rec in recs:
                console.print(
                    f"charged: {rec['gpu_seconds']} GPU-s on {rec['gpus']}x {rec['gpu_model']} "
                    f"at {money.gpu_hour_rate(rec.get('usd_per_gpu_hour'))} = {money.job_usd(rec['cost_usd'])}"
                    + (" so far (running)" if rec.get("so_far") else "")
                    + (f" (attempt {rec['attempt']})" if len(recs) > 1 else ""), soft_wrap=True
                )
            console.print(f"cost: {money.job_cost(recs)}", soft_wrap=True)
            return
        if time.monotonic() >= deadline:
            console.print(f"charge: not recorded yet; see `whaleflux costs --by job` or `whaleflux jobs show {job_id}`")
            return
        time.sleep(0.2)
