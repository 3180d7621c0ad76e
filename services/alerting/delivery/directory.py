"""Receivers as configured, with their URLs and keys resolved, and the deliveries a notification makes.
Pure: the environment the `*_env` settings name is passed in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..config import ReceiverConfig
from ..dispatch.groups import Notification
from ..receivers import WANTS_ACK
from ..receivers.alertmanager import url_for as alertmanager_url
from ..receivers.pagerduty import DEFAULT_URL as PAGERDUTY_URL
from .model import Delivery


@dataclass(frozen=True)
class Receiver:
    config: ReceiverConfig
    urls: list[str]
    routing_key: str  # pagerduty; "" when not set

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def type(self) -> str:
        return self.config.type


class Directory:
    """Receivers by name. URLs and keys named by `*_env` are read from `environ` (URLs may hold tokens)."""

    def __init__(self, receivers: list[ReceiverConfig], environ: Mapping[str, str],
                 url_lists: Mapping[str, list[str]] | None = None) -> None:
        self.receivers = {r.name: r for r in receivers}
        self.environ = environ
        self.url_lists = url_lists or {}  # env name -> URLs already parsed (settings), before `environ`

    def get(self, name: str) -> Receiver | None:
        cfg = self.receivers.get(name)
        if cfg is None:
            return None
        key = cfg.routing_key or self.environ.get(cfg.routing_key_env or "", "")
        return Receiver(cfg, self.urls(cfg), key)

    def urls(self, cfg: ReceiverConfig) -> list[str]:
        urls = self._urls(cfg)
        return [alertmanager_url(u) for u in urls] if cfg.type == "alertmanager" else urls

    def _urls(self, cfg: ReceiverConfig) -> list[str]:
        if cfg.url:
            return [cfg.url]
        if cfg.url_env:
            if cfg.url_env in self.url_lists:
                return self.url_lists[cfg.url_env]
            return [u.strip() for u in self.environ.get(cfg.url_env, "").split(",") if u.strip()]
        return [PAGERDUTY_URL] if cfg.type == "pagerduty" else []

    def plan(self, n: Notification) -> list[Delivery]:
        """One delivery per URL of the notification's receiver; none of what the receiver does not want."""
        recv = self.get(n.receiver)
        rtype = recv.type if recv else "webhook"
        if n.status == "acknowledged" and rtype not in WANTS_ACK:
            return []
        if n.status == "resolved" and recv is not None and not recv.config.send_resolved:
            return []
        count = max(len(recv.urls) if recv else 1, 1)
        return [Delivery(id=f"{n.id}@{n.receiver}#{i}" + (f"~{v}" if v else ""), receiver=n.receiver,
                         receiver_type=rtype, url_index=i, variant=v, notification=n, created_at=n.created_at)
                for i in range(count) for v in _variants(rtype, n)]


def _variants(rtype: str, n: Notification) -> list[int]:
    """PagerDuty folds a trigger into the open incident with the same dedup_key, so an escalation triggers a
    new one (variant = the escalation's number) and a resolution or acknowledgement reaches all of them."""
    if rtype != "pagerduty":
        return [0]
    if n.status == "firing":
        return [n.escalations if n.escalation else 0]
    return list(range(n.escalations + 1))
