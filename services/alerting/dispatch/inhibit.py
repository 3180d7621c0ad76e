"""Inhibition: a firing source alert (a node down) mutes target alerts that share the `equal` labels."""

from __future__ import annotations

from dataclasses import dataclass

from .matchers import Matcher, matches_all


@dataclass(frozen=True)
class InhibitRule:
    source: list[Matcher]
    target: list[Matcher]
    equal: tuple[str, ...]


def inhibited(labels: dict[str, str], fingerprint: str, firing: dict[str, dict[str, str]],
              rules: list[InhibitRule]) -> bool:
    """True when some other firing alert (fingerprint -> labels) is a source that mutes this one."""
    return bool(inhibitors(labels, fingerprint, firing, rules, first=True))


def inhibitors(labels: dict[str, str], fingerprint: str, firing: dict[str, dict[str, str]],
               rules: list[InhibitRule], first: bool = False) -> list[str]:
    """The fingerprints of the firing alerts that mute this one (Alertmanager's `inhibitedBy`)."""
    out: list[str] = []
    for rule in rules:
        if not matches_all(rule.target, labels):
            continue
        for fp, src in firing.items():
            if fp == fingerprint or fp in out or not matches_all(rule.source, src):
                continue
            if all(src.get(k, "") == labels.get(k, "") for k in rule.equal):
                out.append(fp)
                if first:
                    return out
    return out
