"""What finding the jax.Arrays made inside a leak check costs, against how many arrays live.

Run:  python benchmarks/reports.py                 (about half a minute on 2 CPU cores)
      python benchmarks/reports.py --live 1000 10000

For 1k, 10k and 100k live arrays (made beforehand, held by a list), in µs per call (median of
rounds):

* ``jax.live_arrays()`` alone: the floor, a list built in C++ of every live array;
* ``ArrayMark()``: the mark a check takes at its start (weak references to the newest arrays,
  the ids of all for the fallback);
* ``mark.new()`` with 0, 100 and 1000 arrays made since the mark: linear in the new arrays;
* ``check_leaks()`` entered and left with nothing new made (no garbage collection then).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable

import jax
import numpy as np
from _timing import per_call

import tidyjax as tj
from tidyjax._newarrays import ArrayMark


def _make(n: int) -> list[jax.Array]:
    out: list[jax.Array] = []
    one = np.zeros(1, np.float32)
    while len(out) < n:
        out += jax.device_put([one] * min(1000, n - len(out)))
    return out


def _us(fn: Callable[[], object], number: int, rounds: int) -> float:
    fn()
    return 1e6 * statistics.median(per_call(fn, number) for _ in range(rounds))


def _check() -> None:
    with tj.check_leaks():
        pass


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--live", type=int, nargs="+", default=[1000, 10_000, 100_000])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    columns = ["live arrays", "live_arrays()", "ArrayMark()", "new(): 0 new", "100 new",
               "1000 new", "check_leaks, 0 new"]  # fmt: skip
    print(f"jax {jax.__version__}, {jax.devices()[0].platform}; µs per call, median")
    print(" | ".join(f"{c:>18}" for c in columns))
    held: list[jax.Array] = []
    for n in sorted(args.live):
        held += _make(n - len(jax.live_arrays()))
        number = max(3, 200_000 // n)
        floor = _us(jax.live_arrays, number, args.rounds)
        marking = _us(ArrayMark, number, args.rounds)
        new_costs = []
        for k in (0, 100, 1000):
            mark = ArrayMark()
            fresh = _make(k)
            new_costs.append(_us(mark.new, number, args.rounds))
            assert len(mark.new()) == k, (len(mark.new()), k)
            del fresh
        check = _us(_check, number, args.rounds)
        row = [len(jax.live_arrays()), floor, marking, *new_costs, check]
        print(" | ".join(f"{v:>18,.0f}" if i == 0 else f"{v:>18,.1f}" for i, v in enumerate(row)))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
