"""What finding the jax.Arrays made inside a leak check costs, against how many arrays live.

Run:  python benchmarks/reports.py                 (about a minute on 2 CPU cores)
      python benchmarks/reports.py --live 1000 10000 --tensors 5000 20000
      python benchmarks/reports.py --tensors           (the arrays' table alone)

For 1k, 10k and 100k live arrays (made beforehand, held by a list), in µs per call (median of
rounds):

* ``jax.live_arrays()`` alone: the floor, a list built in C++ of every live array;
* ``ArrayMark()``: the mark a check takes at its start (weak references to the newest arrays,
  the ids of all for the fallback);
* ``mark.new()`` with 0, 100 and 1000 arrays made since the mark: linear in the new arrays;
* ``check_leaks()`` entered and left with nothing new made (no garbage collection then).

Then, for 5k, 20k and 100k live Tensors (``--tensors``), in ms per call and µs per live Tensor
(a per-Tensor cost that stays flat as the count grows is a linear report):

* ``live_tensors()``, ``snapshot()`` and ``memory()``;
* ``check_leaks()`` with nothing new made, and with 100 Tensors made inside and leaked (the
  check's report built, its LeakError caught).

Then (``--after``) what a ``memory()`` call costs the program around it: in a scope, a jitted
step over 1,000 leaves, ``memory(scan_untracked=False)``, the next step, the scope's exit
(deleting both steps' outputs); beside the same with no ``memory()`` call, in alternation
(medians, ms). ``memory()`` leaves the books as they are (a batch stays one batch); the exit
after it paid +0.16 to +0.25 ms more on 2026-12-08, against +0.45 to +0.50 when ``memory()``
split the batches; the next step pays about +0.5 ms either way.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
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


def _make_tensors(n: int) -> list[tj.Tensor]:
    return [tj.Tensor(a) for a in _make(n)]


def _leak(k: int) -> Callable[[], None]:
    def run() -> None:
        try:
            with tj.check_leaks():
                made = _make_tensors(k)
        except tj.LeakError:
            pass
        else:
            raise AssertionError("check_leaks found no leak")
        del made

    return run


def _ms(fn: Callable[[], object], number: int, rounds: int) -> float:
    fn()
    return 1e3 * min(per_call(fn, number) for _ in range(rounds))


def tensor_reports(counts: list[int], rounds: int) -> None:
    """The reports' cost against how many Tensors live: ms per call, µs per live Tensor."""
    calls: list[tuple[str, Callable[[], object]]] = [
        ("live_tensors()", tj.live_tensors),
        ("snapshot()", tj.snapshot),
        ("check_leaks, 0 new", _check),
        ("check_leaks, 100 new", _leak(100)),
        ("memory()", tj.memory),
    ]
    unit = "ms (per live Tensor)"
    print(f"\nlive Tensors | {' | '.join(f'{name:>28}' for name, _ in calls)}")
    print(f"{'':>12} | {' | '.join(f'{unit:>28}' for _ in calls)}")
    held: list[tj.Tensor] = []
    for n in sorted(counts):
        held += _make_tensors(n - len(held))
        gc.collect()
        number = max(1, 20_000 // n)
        cells = []
        for _, fn in calls:
            ms = _ms(fn, number, rounds)
            cells.append(f"{ms:>12,.2f} ({1e3 * ms / n:>8.3f} µs)")
        print(f"{n:>12,} | {' | '.join(f'{c:>28}' for c in cells)}")
        sys.stdout.flush()


def after_memory(leaves: int, rounds: int) -> None:
    """A step, then ``memory()`` or not, then the next step and the scope's exit (ms)."""
    params = {f"p{i:05d}": jnp.ones(4) for i in range(leaves)}
    step = tj.jit(lambda p: jax.tree.map(lambda x: x + 1, p))

    def one(report: bool) -> tuple[float, float, float]:
        scope = tj.tidy()
        scope.__enter__()
        state = step(params)
        jax.block_until_ready(jax.tree.leaves(state))
        t0 = time.perf_counter()
        if report:
            tj.memory(scan_untracked=False)
        t1 = time.perf_counter()
        new = step(params)
        jax.block_until_ready(jax.tree.leaves(new))
        t2 = time.perf_counter()
        scope.__exit__(None, None, None)  # deletes both steps' outputs
        t3 = time.perf_counter()
        del state, new
        return t1 - t0, t2 - t1, t3 - t2

    for _ in range(3):
        one(True), one(False)
    with_, without = [], []
    for _ in range(rounds):
        with_.append(one(True))
        without.append(one(False))
    print(f"\nin a scope, a jitted step over {leaves:,} leaves, then (ms, median of {rounds}):")
    print(f"{'':28} | {'memory()':>9} | {'next step':>9} | {'scope exit':>10}")
    for name, runs in (("memory() called", with_), ("no memory() call", without)):
        cells = [1e3 * statistics.median(r[k] for r in runs) for k in range(3)]
        print(f"{name:28} | {cells[0]:>9.2f} | {cells[1]:>9.2f} | {cells[2]:>10.2f}")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--live", type=int, nargs="*", default=[1000, 10_000, 100_000])
    parser.add_argument("--tensors", type=int, nargs="*", default=[5000, 20_000, 100_000])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--tensor-rounds", type=int, default=3)
    parser.add_argument(
        "--after",
        type=int,
        nargs="?",
        const=1000,
        default=1000,
        help="leaves of the step around a memory() call (0: skip)",
    )
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
    del held
    if args.tensors:
        tensor_reports(args.tensors, args.tensor_rounds)
    if args.after:
        after_memory(args.after, 40)


if __name__ == "__main__":
    main()
