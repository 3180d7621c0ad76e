"""Label matchers in Alertmanager's syntax: `name=value`, `name!=value`, `name=~regex`, `name!~regex`."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

_MATCHER = re.compile(r'^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*(.*?)\s*$')


@dataclass(frozen=True)
class Matcher:
    name: str
    op: str
    value: str
    _regex: re.Pattern[str] | None = field(default=None, compare=False, repr=False)

    @classmethod
    def parse(cls, text: str) -> Matcher:
        m = _MATCHER.match(text)
        if not m:
            raise ValueError(f"matcher {text!r}: expected name=value, name!=value, name=~regex or name!~regex")
        name, op, value = m.groups()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        regex = None
        if op in ("=~", "!~"):
            try:
                # Anchored like Alertmanager: the regex must match the whole value.
                regex = re.compile(f"^(?:{value})$")
            except (re.error, RecursionError, OverflowError) as exc:  # nested too deep, a repeat too large
                raise ValueError(f"matcher {text!r}: bad regex: {exc}") from None
        return cls(name, op, value, regex)

    def matches(self, labels: dict[str, str]) -> bool:
        actual = labels.get(self.name, "")
        if self.op == "=":
            return actual == self.value
        if self.op == "!=":
            return actual != self.value
        hit = self._regex is not None and bool(self._regex.match(actual))
        return hit if self.op == "=~" else not hit

    def __str__(self) -> str:
        return f'{self.name}{self.op}"{self.value}"'


def parse_matchers(value: Any) -> list[Matcher]:
    """A list of matcher strings, or a mapping name -> value (equality), into Matchers."""
    if value is None:
        return []
    if isinstance(value, dict):
        return [Matcher(str(k), "=", str(v)) for k, v in value.items()]
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise ValueError("expected a list of matchers such as ['severity=critical', 'pool=~\"a|b\"']")
    out = []
    for item in value:
        if isinstance(item, Matcher):
            out.append(item)
        elif isinstance(item, str):
            out.append(Matcher.parse(item))
        else:
            raise ValueError("each matcher is a string such as 'severity=critical'")
    return out


def matches_all(matchers: list[Matcher], labels: dict[str, str]) -> bool:
    return all(m.matches(labels) for m in matchers)
