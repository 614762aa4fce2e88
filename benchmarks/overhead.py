"""Per-op overhead of tidyjax vs raw JAX, and the cost of a tidy scope.

Run:  python benchmarks/overhead.py            (about a minute on 2 CPU cores)

Every ratio compares two things measured side by side in the same run: the samples of each pair
are taken in alternation, and the ratio is of their medians, so machine noise hits both sides.
"""

from __future__ import annotations

import argparse
import statistics
import time

import core
import jax
import jax.numpy as jnp
from _timing import per_call, side_by_side

import tidyjax as tj


def op_overhead(number: int, rounds: int) -> None:
    print("== Tensor ops and lifted calls vs the same raw jax, eager, CPU (benchmarks/core.py) ==")
    print(f"{'workload':58s} {'raw µs':>10s} {'tidyjax µs':>10s} {'ratio':>7s}")
    core.eager(number, rounds)


def scope_cost(rounds: int) -> None:
    print()
    print("== tidy enter + exit cost vs tensors created in the scope, and vs tensors alive ==")
    print("   (the body makes n clones of one tensor; outside, distinct tensors or clones of it)")
    x = tj.tensor(jnp.ones(4))
    print(f"{'in scope':>9s} {'alive outside':>22s} {'µs / scope':>11s} {'µs / tensor':>12s}")
    for alive, kind in ((0, "-"), (10_000, "distinct"), (10_000, "clones of it")):
        if kind == "distinct":
            outside = [x + float(i) for i in range(alive)]
        else:
            outside = [x.clone() for _ in range(alive)]
        for n in (0, 10, 100, 1000):

            def body(n: int = n) -> None:
                with tj.tidy():
                    for _ in range(n):
                        x.clone()

            number = max(1, 2000 // max(n, 1))
            samples = [per_call(body, number) for _ in range(rounds)]
            cost = statistics.median(samples)
            per = f"{cost / n * 1e6:12.3f}" if n else f"{'-':>12s}"
            print(f"{n:9d} {alive:9d} {kind:>12s} {cost * 1e6:11.2f} {per}")
        tj.dispose(outside)
    x.dispose()


def creation_sites(number: int, rounds: int) -> None:
    print()
    print("== creation sites: read from JAX's own array tracebacks, only when a report asks ==")
    from jax._src.lib import _jax  # the switch JAX uses for array tracebacks (on by default)

    x, y = jnp.linspace(0.0, 1.0, 256), jnp.linspace(1.0, 2.0, 256)
    t, u = tj.tensor(x), tj.tensor(y)

    def traced() -> None:
        _jax.set_tracebacks_enabled(True)
        for _ in range(number):
            t + u

    def untraced() -> None:
        _jax.set_tracebacks_enabled(False)
        for _ in range(number):
            t + u

    off, on = side_by_side(untraced, traced, 1, rounds)
    _jax.set_tracebacks_enabled(True)
    print(f"Tensor a + b, tracebacks off {off / number * 1e6:.2f} µs, on (default) "
          f"{on / number * 1e6:.2f} µs, ratio {on / off:.3f}")  # fmt: skip
    print("(tidyjax adds no per-op work for sites; this is JAX's default cost, paid anyway)")
    many = [t + float(i) for i in range(1000)]
    t0 = time.perf_counter()
    records = tj.live_tensors()
    elapsed = time.perf_counter() - t0
    print(f"live_tensors() with {len(records)} tensors alive: {elapsed * 1e3:.1f} ms")
    tj.dispose([t, u, many])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--number", type=int, default=2000, help="calls per sample")
    parser.add_argument("--rounds", type=int, default=15, help="samples per side")
    args = parser.parse_args()
    print(f"jax {jax.__version__} on {jax.default_backend()}, tidyjax {tj.__version__}")
    op_overhead(args.number, args.rounds)
    scope_cost(args.rounds)
    creation_sites(args.number, args.rounds)


if __name__ == "__main__":
    main()
