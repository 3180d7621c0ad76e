"""Budgets and forecasts per team, project or the whole cluster. Pure, no I/O.

Spend is a daily series (UTC days) the shell computes with the chargeback:
allocated cost for a team or project, fleet cost (allocated + idle) for the
cluster. For a monthly budget at time `now`:

- spend to date: the period's days up to now;
- burn-rate projection: spend to date / elapsed x period length;
- trend projection: spend to date + the trailing 7 days' daily mean x days left;
- the projection compared with the thresholds is the larger of the two, and
  only from one elapsed day on (before that, the spend itself), so the first
  hours of a month do not page anyone.

Alerts, each raise once (its event id is fixed by content):
- `raised-cost-budget-<scope>-<name>-<YYYYMM>-<pct>` when the projection
  reaches pct% of the budget (each threshold of each period once);
- `raised-cost-week-<scope>-<name>-<YYYYMMDD>` when a week's (Monday to
  Sunday) spend exceeds its forecast by `week_overrun_pct` (15) or more: the
  current week as soon as its spend so far does (during the week, not the
  Monday after), or the last complete week if that was missed. The forecast
  is the mean of the four complete weeks before the week, leaving out weeks
  before the first day with spend and the first week with spend when that
  began after its Monday (partial). Backtested on synthetic seasonal spend
  in `tests/test_billing_money.py`.

Each alert resolves like every alert (`alert.resolved`) when it is no longer
due: the projection back under the threshold (a budget raised, a cost
corrected, a replay), its month over, the budget removed, or the week alert's
week no longer the current or last complete one (`alert_changes`, from what
billing raised and has not resolved, `Firing`). Each raise also carries
`ends_at`, the end of the period it is about (the month; the week after the
week), so alerting resolves it then even if billing is down. Due again after
a resolution, it is raised again (event id `...-<n>` for the n-th firing).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from whaleflux.shared.events import AlertRaised, AlertResolved

from .ownership import month_start, next_month
from .pricing import to_cents

DAY = timedelta(days=1)


class Budget(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    scope: Literal["team", "project", "cluster"]
    name: str = Field("all", min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.-]+$")
    period: Literal["month"] = "month"
    amount_usd: Decimal = Field(gt=0)
    thresholds_pct: list[int] = Field(default_factory=lambda: [80, 100], min_length=1)
    week_overrun_pct: Decimal = Field(Decimal(15), gt=0)

    @property
    def ident(self) -> str:
        return f"{self.scope}-{self.name}"

    @property
    def label(self) -> str:
        return "Cluster" if self.scope == "cluster" else f"{self.scope.capitalize()} {self.name}"


@dataclass(frozen=True)
class BudgetAlert:
    event_id: str
    fingerprint: str
    rule: str
    severity: str
    summary: str
    value: float
    labels: dict[str, str]
    ends_at: datetime  # the end of the period it is about: alerting resolves it then at the latest


class Firing(BaseModel):
    """A cost alert billing raised: how many times, whether it fires now, what its resolution repeats."""

    count: int
    firing: bool
    rule: str
    labels: dict[str, str]
    summary: str
    starts_at: datetime


def alert_changes(due: list[BudgetAlert], state: dict[str, Firing], now: datetime
                  ) -> list[tuple[str, AlertRaised | AlertResolved, Firing]]:
    """The events due at `now` (event id, event, the fingerprint's state after it): a raise for each alert
    due and not firing, a resolution for each one firing and no longer due."""
    out: list[tuple[str, AlertRaised | AlertResolved, Firing]] = []
    by_fp = {a.fingerprint: a for a in due}
    for fp, a in by_fp.items():
        was = state.get(fp)
        if was is not None and was.firing:
            continue
        n = 1 if was is None else was.count + 1
        labels = {"alertname": a.rule, **a.labels}
        raised = AlertRaised(fingerprint=fp, rule=a.rule, severity=a.severity, category="cost", summary=a.summary,
                             labels=labels, value=a.value, starts_at=now, ends_at=a.ends_at)
        out.append((a.event_id if n == 1 else f"{a.event_id}-{n}", raised,
                    Firing(count=n, firing=True, rule=a.rule, labels=labels, summary=a.summary, starts_at=now)))
    for fp, was in sorted(state.items()):
        if was.firing and fp not in by_fp:
            resolved = AlertResolved(fingerprint=fp, rule=was.rule, labels=was.labels, summary=was.summary,
                                     starts_at=was.starts_at, ends_at=now)
            out.append((f"resolved-{fp}-{was.count}", resolved, was.model_copy(update={"firing": False})))
    return out


@dataclass(frozen=True)
class BudgetStatus:
    budget: Budget
    period_start: datetime
    period_end: datetime
    spend_to_date: Decimal
    projected_burn: Decimal
    projected_trend: Decimal
    projected_pct: float
    last_week_start: date | None
    last_week_usd: Decimal | None
    last_week_forecast_usd: Decimal | None
    alerts: tuple[BudgetAlert, ...]


def _sum(daily: dict[date, Decimal], start: date, end: date) -> Decimal:
    """Spend over days [start, end)."""
    return sum((v for d, v in daily.items() if start <= d < end), Decimal(0))


def history_start(now: datetime) -> date:
    """The first day the evaluation needs: the period start or five weeks back, whichever is earlier."""
    week = (now.date() - timedelta(days=now.weekday())) - timedelta(weeks=5)
    return min(month_start(now).date(), week)


def week_forecast(daily: dict[date, Decimal], monday: date) -> Decimal | None:
    """The forecast of the week from `monday`: the mean of the four complete weeks before it, leaving out
    weeks before the first day with spend and the first week with spend if it began after its Monday."""
    spent = [d for d, v in daily.items() if v and d < monday]
    if not spent:
        return None
    first = min(spent)
    weeks = [monday - timedelta(weeks=k) for k in range(4, 0, -1)]
    used = [w for w in weeks if w >= first]  # weeks wholly after spend began (a week it began in mid-week: partial)
    if not used:
        return None
    return sum((_sum(daily, w, w + timedelta(weeks=1)) for w in used), Decimal(0)) / len(used)


def _week_alert(budget: Budget, labels: dict[str, str], monday: date, spent: Decimal, forecast: Decimal,
                done: bool) -> BudgetAlert:
    over = float((spent / forecast - 1) * 100)
    fp = f"cost-week-{budget.ident}-{monday:%Y%m%d}"
    when = f"in the week of {monday}" if done else f"so far in the week of {monday}"
    return BudgetAlert(
        event_id=f"raised-{fp}", fingerprint=fp, rule="SpendAboveForecast", severity="warning",
        summary=(f"{budget.label} spend exceeded forecast by {over:.0f}% {when} "
                 f"(${to_cents(spent):,} against ${to_cents(forecast):,} forecast for the week)"),
        value=round(over, 2), labels={**labels, "week": monday.isoformat()},
        ends_at=datetime(monday.year, monday.month, monday.day, tzinfo=UTC) + timedelta(weeks=2),
    )


def evaluate(budget: Budget, daily: dict[date, Decimal], now: datetime) -> BudgetStatus:
    """Spend, projections and the alerts due at `now` for one budget."""
    start, end = month_start(now), next_month(now)
    today = now.date()
    # Today counts in proportion to the hours passed: spend so far includes today's partial day.
    spend = _sum(daily, start.date(), today + DAY)
    elapsed = (now - start).total_seconds()
    length = (end - start).total_seconds()
    burn = spend * Decimal(length) / Decimal(elapsed) if elapsed > 0 else spend
    trailing = _sum(daily, today - timedelta(days=6), today + DAY) / 7
    trend = spend + trailing * Decimal((end - now).total_seconds()) / Decimal(86400)
    projected = max(spend, burn, trend) if elapsed >= 86400 else spend
    pct = float(projected / budget.amount_usd * 100)
    labels = {"scope": budget.scope, "name": budget.name, "period": start.strftime("%Y-%m")}
    alerts = []
    reached = [t for t in sorted(budget.thresholds_pct) if pct >= t]
    for t in reached:
        fp = f"cost-budget-{budget.ident}-{start:%Y%m}-{t}"
        alerts.append(BudgetAlert(
            event_id=f"raised-{fp}", fingerprint=fp, rule="BudgetProjection",
            severity="critical" if t >= 100 else "warning",
            summary=(f"{budget.label} projected to spend ${to_cents(projected):,} in {start:%B %Y}, "
                     f"{pct:.0f}% of its ${to_cents(budget.amount_usd):,} budget (threshold {t}%; "
                     f"${to_cents(spend):,} spent so far)"),
            value=round(pct, 2), labels={**labels, "threshold_pct": str(t)}, ends_at=end,
        ))
    this_week = today - timedelta(days=today.weekday())
    week_start = this_week - timedelta(weeks=1)  # the last complete week
    last = _sum(daily, week_start, this_week)
    forecast = week_forecast(daily, week_start)
    so_far = _sum(daily, this_week, today + DAY)
    current = week_forecast(daily, this_week)
    for monday, spent, expected, done in ((this_week, so_far, current, False), (week_start, last, forecast, True)):
        if expected and spent >= expected * (1 + budget.week_overrun_pct / 100):
            alerts.append(_week_alert(budget, labels, monday, spent, expected, done))
            break  # one week at a time: the current one first
    return BudgetStatus(budget, start, end, spend, burn, trend, round(pct, 2), week_start, last,
                        forecast, tuple(alerts))


def day_windows(first: date, now: datetime) -> list[tuple[datetime, datetime]]:
    """UTC day windows from `first` to now (the last one partial)."""
    out = []
    d = datetime(first.year, first.month, first.day, tzinfo=UTC)
    while d < now:
        out.append((d, min(d + DAY, now)))
        d += DAY
    return out
