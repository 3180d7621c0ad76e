"""The pure rules of idempotent submission: which keys are valid, when two requests are the same, and what a
request with a used key gets (no I/O)."""

from __future__ import annotations

from whaleflux.scheduler import idempotency as idem
from whaleflux.shared.job_events import submitted_event_id


def test_the_same_fields_in_another_order_have_the_same_fingerprint():
    a = {"name": "x", "env": {"A": "1", "B": "2"}, "gpus": 1}
    b = {"gpus": 1, "env": {"B": "2", "A": "1"}, "name": "x"}
    assert idem.fingerprint(a) == idem.fingerprint(b)


def test_any_change_of_meaning_changes_the_fingerprint():
    base = {"name": "x", "command": ["true"], "gpus": 1}
    for changed in ({**base, "gpus": 2}, {**base, "command": ["false"]}, {**base, "env": {}}):
        assert idem.fingerprint(changed) != idem.fingerprint(base)


def test_a_first_use_is_new_a_repeat_replays_and_another_body_conflicts():
    claim = idem.Claim(fingerprint=idem.fingerprint({"a": 1}), job_ids=["j1"])
    assert idem.verdict(None, idem.fingerprint({"a": 1})) is idem.Verdict.NEW
    assert idem.verdict(claim, idem.fingerprint({"a": 1})) is idem.Verdict.REPLAY
    assert idem.verdict(claim, idem.fingerprint({"a": 2})) is idem.Verdict.CONFLICT


def test_a_conflict_names_the_header_and_the_first_job():
    detail = idem.conflict_detail(idem.Claim(fingerprint="f", job_ids=["abc123", "abc123-r1"]))
    assert "Idempotency-Key" in detail and "abc123" in detail


def test_keys_are_bounded_visible_ascii():
    assert idem.key_problem("7b0c2f4e-9d1a-4c55-8f00-1b2a3c4d5e6f") is None
    assert idem.key_problem("x" * 255) is None
    for bad in ("", "x" * 256, "has space", "tab\t", "é"):
        problem = idem.key_problem(bad)
        assert problem is not None and problem.startswith("Idempotency-Key")


def test_a_key_is_stored_by_a_fixed_length_digest():
    assert len(idem.key_digest("k")) == len(idem.key_digest("k" * 255)) == 64
    assert idem.key_digest("k") != idem.key_digest("K")
    assert idem.key_digest("k", "alice") != idem.key_digest("k", "bob")  # one caller's key is never another's


def test_a_keyed_submission_gets_the_same_valid_job_id_each_time():
    from pydantic import TypeAdapter

    from whaleflux.shared.event_data import JobId

    digest = idem.key_digest("retry-me", "alice")
    assert idem.job_id_for(digest) == idem.job_id_for(idem.key_digest("retry-me", "alice"))
    assert TypeAdapter(JobId).validate_python(idem.job_id_for(digest))


def test_a_jobs_submission_event_id_is_fixed_by_the_job():
    assert submitted_event_id("abc") == submitted_event_id("abc") != submitted_event_id("abd")
