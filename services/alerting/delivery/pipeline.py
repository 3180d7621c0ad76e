"""Run a delivery through its stages; the first stage with an outcome ends it. No I/O of its own."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime

from .directory import Directory
from .model import Delivery
from .stages import Job, Mute, Muted, Outcome, Post, RateLimit, Render, ResolveReceiver, Send

Stage = Callable[[Job], "Outcome | None | Awaitable[Outcome | None]"]


class Pipeline:
    def __init__(self, stages: Sequence[Stage]) -> None:
        self.stages = list(stages)

    async def run(self, delivery: Delivery, now: datetime) -> tuple[Job, Outcome]:
        job = Job(delivery, now)
        for stage in self.stages:
            result = stage(job)
            if inspect.isawaitable(result):
                result = await result
            if result is not None:
                return job, result
        raise RuntimeError("the pipeline ended without an outcome: its last stage must post")


def standard(directory: Callable[[], Directory], muted: Muted, rate_limit: RateLimit, external_url: str,
             send: Send, max_age_s: float) -> Pipeline:
    """resolve receiver -> inhibit and silence -> rate limit -> render -> post."""
    return Pipeline([ResolveReceiver(directory), Mute(muted), rate_limit, Render(external_url),
                     Post(send, max_age_s)])
