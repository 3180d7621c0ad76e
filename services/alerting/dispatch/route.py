"""The route tree: data built from config. An alert walks it and lands in one or more routes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from .matchers import Matcher, matches_all

if TYPE_CHECKING:
    from ..config import RouteConfig

# Sub-second paging is the point of WhaleFlux: unlike Alertmanager (30 s, 5 m, 4 h),
# the root route notifies at once and sends updates every few seconds.
DEFAULT_GROUP_BY = ("incident",)
DEFAULT_GROUP_WAIT_S = 0.0
DEFAULT_GROUP_INTERVAL_S = 5.0
DEFAULT_REPEAT_INTERVAL_S = 4 * 3600.0


@dataclass(frozen=True)
class Route:
    id: str
    receiver: str
    matchers: tuple[Matcher, ...] = ()
    continue_: bool = False
    group_by: tuple[str, ...] = DEFAULT_GROUP_BY
    group_wait_s: float = DEFAULT_GROUP_WAIT_S
    group_interval_s: float = DEFAULT_GROUP_INTERVAL_S
    repeat_interval_s: float = DEFAULT_REPEAT_INTERVAL_S
    routes: tuple[Route, ...] = field(default_factory=tuple)
    path: str = "{}"  # Alertmanager's route key: each route's matchers from the root, `{}/{category="cost"}`

    def match(self, labels: dict[str, str]) -> list[Route]:
        """The routes this alert lands in: deepest matching children, siblings only after `continue`."""
        if not matches_all(list(self.matchers), labels):
            return []
        found: list[Route] = []
        for child in self.routes:
            hit = child.match(labels)
            if hit:
                found.extend(hit)
                if not child.continue_:
                    break
        return found or [self]

    def find(self, route_id: str) -> Route | None:
        if self.id == route_id:
            return self
        for child in self.routes:
            hit = child.find(route_id)
            if hit is not None:
                return hit
        return None


_T = TypeVar("_T")


def _pick(value: _T | None, inherited: _T) -> _T:
    return inherited if value is None else value


def build_route(cfg: RouteConfig, parent: Route | None = None, route_id: str = "root") -> Route:
    """A Route from config (`config.RouteConfig`); unset fields inherit from the parent, as in Alertmanager."""
    pick = _pick

    base = parent or Route(id="", receiver=cfg.receiver or "default")
    children_parent = Route(
        id=route_id,
        receiver=pick(cfg.receiver, base.receiver),
        matchers=tuple(cfg.matchers),
        continue_=cfg.continue_,
        group_by=tuple(pick(cfg.group_by, base.group_by)),
        group_wait_s=pick(cfg.group_wait, base.group_wait_s),
        group_interval_s=pick(cfg.group_interval, base.group_interval_s),
        repeat_interval_s=pick(cfg.repeat_interval, base.repeat_interval_s),
        path=(parent.path + "/" if parent else "") + "{" + ",".join(str(m) for m in cfg.matchers) + "}",
    )
    children = tuple(build_route(c, children_parent, f"{route_id}.{i}") for i, c in enumerate(cfg.routes))
    return Route(**{**children_parent.__dict__, "routes": children})
