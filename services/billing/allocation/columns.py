"""Grouping on numpy columns, shared by the chargeback and the showback. Pure, no I/O."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["I64", "codes", "sum_by"]
I64 = npt.NDArray[np.int64]


def codes(values: list[str]) -> tuple[list[str], I64]:
    """The distinct values in order of first appearance, and each value's index among them."""
    names = list(dict.fromkeys(values))
    index = {v: i for i, v in enumerate(names)}
    return names, np.fromiter(map(index.__getitem__, values), np.int64, len(values))


def sum_by(key: I64, values: I64, n: int) -> tuple[I64, I64]:
    """The distinct keys (below `n`) in order and the sum of `values` for each: on a table of `n` sums where
    it is small enough, else by a sort (`np.unique`)."""
    if n <= 4 * len(key) + 1024:
        sums = np.zeros(n, dtype=np.int64)
        np.add.at(sums, key, values)
        keys = np.flatnonzero(np.bincount(key, minlength=n))
        return keys, sums[keys]
    keys, inverse = np.unique(key, return_inverse=True)
    sums = np.zeros(len(keys), dtype=np.int64)
    np.add.at(sums, inverse.reshape(-1), values)
    return keys, sums
