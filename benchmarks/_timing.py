"""Side-by-side timing shared by the benchmarks: alternate the two sides, compare medians."""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from typing import Any


def per_call(fn: Callable[[], object], number: int) -> float:
    """Seconds per call of ``fn``, over ``number`` calls."""
    t0 = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - t0) / number


class FullCollections:
    """Counts the cyclic collector's full (generation-2) collections per side of a
    `side_by_side` run: ``per_100(side)`` is their number per 100 calls of that side."""

    def __init__(self) -> None:
        self.side = -1  # the side running now (0: a, 1: b), -1: neither
        self.full = [0, 0]
        self.calls = [0, 0]

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start" and info["generation"] == 2 and self.side >= 0:
            self.full[self.side] += 1

    def per_100(self, side: int) -> float:
        return 100.0 * self.full[side] / self.calls[side] if self.calls[side] else 0.0


def side_by_side(
    a: Callable[[], object],
    b: Callable[[], object],
    number: int,
    rounds: int,
    warmup: int = 3,
    collections: FullCollections | None = None,
) -> tuple[float, float]:
    """Median seconds per call of ``a`` and ``b``, sampled in alternation (noise hits both).

    ``collections``: counts the full garbage collections that run during each side's rounds
    (warmup excluded); the count costs nothing per call (a gc callback, set once per round)."""
    for _ in range(warmup):  # compile, allocate
        a()
        b()
    sa, sb = [], []
    if collections is not None:
        gc.callbacks.append(collections)
    try:
        for _ in range(rounds):
            for side, fn, samples in ((0, a, sa), (1, b, sb)):
                if collections is not None:
                    collections.side = side
                    collections.calls[side] += number
                samples.append(per_call(fn, number))
                if collections is not None:
                    collections.side = -1
    finally:
        if collections is not None:
            gc.callbacks.remove(collections)
    return statistics.median(sa), statistics.median(sb)
