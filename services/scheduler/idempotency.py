"""Idempotent submission: what a repeat of `POST /v1/jobs` with the same `Idempotency-Key` gets.

A JetStream publish whose acknowledgement times out (NATS stalled) is ambiguous: the message may be
stored once the server wakes up. So a submission's identity (its job ids, and the event id each
`job.submitted` carries as its Nats-Msg-Id) is fixed by its key before the first publish, and every
retry publishes exactly those events again: JetStream drops a repeat within its duplicate window, the
scheduler's `SET NX` on the job id past it. The outcome is one job, whichever try got through.
"""

from __future__ import annotations

import hashlib
import json
from enum import Enum
from typing import Any

from pydantic import BaseModel, Field

HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
KEY_TTL_S = 24 * 3600  # how long a key is remembered; a client retries well within it
MAX_KEY_CHARS = 255


class Claim(BaseModel):
    """What a key stands for: the request it came with (a digest) and the jobs it made."""

    fingerprint: str
    job_ids: list[str] = Field(min_length=1)
    # The publish of every job.submitted was acknowledged: nothing left to publish again.
    durable: bool = False


class Verdict(str, Enum):
    NEW = "new"  # first use of the key: submit
    REPLAY = "replay"  # the same request again: answer with the first one's jobs
    CONFLICT = "conflict"  # the key came with another body: refuse


def key_problem(key: str) -> str | None:
    """Why a header value cannot be a key (None when it can): 1 to 255 visible ASCII characters."""
    if not 1 <= len(key) <= MAX_KEY_CHARS:
        return f"{HEADER}: 1 to {MAX_KEY_CHARS} characters"
    if not all("!" <= c <= "~" for c in key):
        return f"{HEADER}: visible ASCII characters only"
    return None


def fingerprint(fields: dict[str, Any]) -> str:
    """A digest of a request's meaning: the same fields give the same digest, whatever their order in the JSON."""
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def key_digest(key: str, caller: str = "") -> str:
    """The key as stored: a fixed-length digest of the caller's name and the key (the client's text is never a
    Redis key name, and one caller's key is never another's)."""
    return hashlib.sha256(f"{caller}\n{key}".encode()).hexdigest()


def job_id_for(digest: str) -> str:
    """The job id a keyed submission gets: the same for every repeat, so that a repeat after the scheduler lost its
    keys (a wiped Redis) publishes the very same job.submitted, which JetStream drops or the scheduler already
    holds (rebuilt from its stream), instead of a second job."""
    return digest[:12]


def verdict(claim: Claim | None, print_: str) -> Verdict:
    """What a request with this fingerprint gets, given what its key already stands for."""
    if claim is None:
        return Verdict.NEW
    return Verdict.REPLAY if claim.fingerprint == print_ else Verdict.CONFLICT


def conflict_detail(claim: Claim) -> str:
    """The 422's reason: names the header and the job the key stands for."""
    return (f"{HEADER}: already used with a different request body (for job {claim.job_ids[0]}); "
            "send a new key for a new job")

