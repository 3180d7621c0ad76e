"""Delivery: a queued notification for one URL of one receiver goes through a pipeline of small stages.

resolve receiver -> inhibit and silence -> rate limit -> render -> post -> record
(`stages.py`, run by `pipeline.py`), after Alertmanager's notify pipeline. Each
stage is testable without Redis or HTTP; the queue itself is in `store.py`.
"""
