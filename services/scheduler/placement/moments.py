"""Times in reasons. Pure.

The decision core knows moments as epoch seconds and has no clock of its own to
say "in 2 h" by, nor a time zone: it writes a moment into a reason as a marker
(`at`), which stays the same from pass to pass, and the edge that shows the
reason to a person turns every marker into local time and how far off it is
(`in_words`, with the clock and zone of that moment). A span of time the core
knows outright (a job's runtime) it writes in words itself (`span`).
"""

from __future__ import annotations

import re
from datetime import datetime, tzinfo

MARK = re.compile(r"\{at:(-?\d+)\}")


def at(epoch_s: float) -> str:
    """A moment, for `in_words` to put in words."""
    return f"{{at:{epoch_s:.0f}}}"


def span(seconds: float) -> str:
    """A length of time in words: "45 s", "12 min", "2 h 10 min", "3 d 4 h"."""
    s = round(abs(seconds))
    if s < 60:
        return f"{s} s"
    minutes = round(s / 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h" + (f" {minutes} min" if minutes else "")
    days, hours = divmod(hours, 24)
    return f"{days} d" + (f" {hours} h" if hours else "")


def moment(epoch_s: float, now: datetime) -> str:
    """A moment in `now`'s zone and how far from `now`: "14:30 UTC (in 2 h 10 min)" today, else with its date
    ("Mon 7 Dec 14:30 UTC (in 1 d 2 h)", and the year when not this year's)."""
    when = datetime.fromtimestamp(epoch_s, now.tzinfo)
    clock = f"{when:%H:%M}" + (f" {when:%Z}" if when.tzinfo is not None and when.strftime("%Z") else "")
    if when.date() != now.date():
        clock = f"{when:%a} {when.day} {when:%b}" + (f" {when.year}" if when.year != now.year else "") + " " + clock
    left = epoch_s - now.timestamp()
    if abs(left) < 1:
        return f"{clock} (now)"
    return f"{clock} (in {span(left)})" if left > 0 else f"{clock} ({span(left)} ago)"


def in_words(text: str, now: datetime) -> str:
    """The reason with every moment in `now`'s zone and how far from `now` (`now`: aware, in the reader's zone)."""
    return MARK.sub(lambda m: moment(float(m.group(1)), now), text)


def local(now: datetime, zone: tzinfo | None = None) -> datetime:
    """`now` in `zone`, or in this machine's local zone."""
    return now.astimezone(zone)
