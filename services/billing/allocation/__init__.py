"""Chargeback and showback over a window: job costs, the idle line per pool and model, shown to the cent. Pure.

Rounding rule (extends pricing.py):
- a job attempt's fixed cost is, per rate segment of the GPUs it held (a
  calendar month, a price period, a lease term), held milliseconds x USD per
  millisecond, kept to 1e-6 USD (half-even);
- a job attempt's power cost is, per GPU and hour, joules / 3.6e6 x USD/kWh,
  kept to 1e-6 USD;
- fleet cost per pool and model is computed the same way over every GPU's
  whole segment; idle = fleet - allocated, exactly;
- every shown line (a job/team/project row, its idle share, an idle line's
  fleet and idle, the running line) is its own exact amount rounded half-up
  to the cent; every shown total is the sum of the shown lines it totals, so
  a report adds up to the cent internally. Rows and idle lines are two
  breakdowns of one fleet rounded apart: their difference is shown as
  `rounding_usd` (a few cents at most), never hidden in a line.

`chargeback.py` computes the exact amounts over the intervals as numpy columns
(integer micro-dollars, the same roundings), `showback.py` groups and shows them.
"""

from .attempts import Attempts, JobInfo
from .chargeback import Chargeback, EnergyUse, GroupCost, Interval, IntervalTable, JobCost, chargeback
from .showback import GROUP_KEYS, IdleLine, Row, Showback, showback, split_by_use

__all__ = ["GROUP_KEYS", "Attempts", "Chargeback", "EnergyUse", "GroupCost", "IdleLine", "Interval", "IntervalTable",
           "JobCost", "JobInfo", "Row", "Showback", "chargeback", "showback", "split_by_use"]
