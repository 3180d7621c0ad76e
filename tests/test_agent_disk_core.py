"""A full disk is a node fault, pure parts: which errors are the node's fault and what its reason says (disk.py), and
the records pipe's lines."""

from __future__ import annotations

import errno
from datetime import UTC, datetime

import pytest

from whaleflux.agent import attempts, disk

T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(("code", "problem"), [
    (errno.ENOSPC, "no space left on device"),
    (errno.EDQUOT, "disk quota exceeded"),
    (errno.EROFS, "read-only file system"),
    (errno.EIO, "input/output error"),
])
def test_a_full_over_quota_read_only_or_failing_disk_is_the_nodes_fault(code, problem):
    assert disk.node_fault(OSError(code, "whatever the OS says")) == problem


@pytest.mark.parametrize("exc", [
    OSError(errno.ENOENT, "No such file or directory"),
    PermissionError(errno.EACCES, "Permission denied"),
    ValueError("not an OS error"),
])
def test_other_errors_are_no_disk_fault(exc):
    assert disk.node_fault(exc) is None


def test_a_disk_error_wrapped_by_what_it_interrupted_is_still_found():
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as inner:
            raise RuntimeError("could not record the start") from inner
    except RuntimeError as outer:
        assert disk.node_fault(outer) == "no space left on device"


def test_an_empty_store_gives_the_reason_the_node_reports():
    assert disk.shortage("attempt store", 0, disk.MIN_FREE_BYTES) == "attempt store: no space left on device, 0 B free"


def test_a_store_short_of_the_minimum_says_how_much_is_free_and_needed():
    why = disk.shortage("log directory", 1536 * 1024, 16 * 1024 * 1024)
    assert why == "log directory: less than 16 MiB free, 1.5 MiB free"


def test_a_store_with_the_minimum_free_takes_attempts():
    assert disk.shortage("attempt store", 16 * 1024 * 1024, 16 * 1024 * 1024) is None


@pytest.mark.parametrize(("n", "text"), [
    (0, "0 B"), (512, "512 B"), (1024, "1 KiB"), (1536, "1.5 KiB"), (200 * 1024, "200 KiB"),
    (16 * 1024 ** 2, "16 MiB"), (3 * 1024 ** 3, "3 GiB"), (-5, "0 B"),
])
def test_sizes_read_as_people_read_them(n, text):
    assert disk.size_text(n) == text


def test_a_reason_without_a_known_free_space_names_the_store_and_the_problem():
    assert disk.reason("attempt store", "read-only file system", None) == "attempt store: read-only file system"


def test_the_supervisors_records_cross_the_pipe_whole_and_a_cut_line_is_skipped():
    running = attempts.Running(10, 11, T0)
    ended = attempts.Exit(finished_at=T0, exit_code=0)
    got = attempts.record_line(running) + attempts.record_line(ended) + b'{"exit.json": {"finis'
    assert attempts.records_of(got) == (running, ended)
    assert attempts.records_of(b"") == (None, None)
