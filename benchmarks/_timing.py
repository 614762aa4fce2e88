"""Side-by-side timing shared by the benchmarks: alternate the two sides, compare medians."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def per_call(fn: Callable[[], object], number: int) -> float:
    """Seconds per call of ``fn``, over ``number`` calls."""
    t0 = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - t0) / number


def side_by_side(
    a: Callable[[], object],
    b: Callable[[], object],
    number: int,
    rounds: int,
    warmup: int = 3,
) -> tuple[float, float]:
    """Median seconds per call of ``a`` and ``b``, sampled in alternation (noise hits both)."""
    for _ in range(warmup):  # compile, allocate
        a()
        b()
    sa, sb = [], []
    for _ in range(rounds):
        sa.append(per_call(a, number))
        sb.append(per_call(b, number))
    return statistics.median(sa), statistics.median(sb)
