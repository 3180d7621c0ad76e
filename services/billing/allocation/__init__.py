"""Chargeback and showback over a window: job costs, the idle line per pool and model, shown to the cent. Pure.

Rounding rule (extends pricing.py):
- a job attempt's fixed cost is, per rate segment of the GPUs it held (a
  calendar month, a price period, a lease term), held milliseconds x USD per
  millisecond, kept to 1e-6 USD (half-even);
- a job attempt's power cost is, per GPU and hour, joules / 3.6e6 x USD/kWh,
  kept to 1e-6 USD;
- fleet cost per pool and model is computed the same way over every GPU's
  whole segment; idle = fleet - allocated, exactly;
- shown amounts are cents apportioned by largest remainder so that the shown
  lines (job/team/project rows plus idle lines) add up to the shown fleet total
  (the exact total rounded half-up). A line can therefore differ by one cent
  from its own rounding; the total never does.

`chargeback.py` computes the exact amounts, `showback.py` groups and shows them.
"""

from .chargeback import Chargeback, EnergyUse, GroupCost, Interval, JobCost, JobInfo, chargeback
from .showback import GROUP_KEYS, IdleLine, Row, Showback, apportion, showback

__all__ = ["GROUP_KEYS", "Chargeback", "EnergyUse", "GroupCost", "IdleLine", "Interval", "JobCost", "JobInfo", "Row",
           "Showback", "apportion", "chargeback", "showback"]
