"""Soak: 100,000 steps of a tidy loop; memory() and process RSS must stay flat.

Run:  python benchmarks/soak.py [--steps 100000] [--every 10000]

Each step makes a dozen intermediates (eager ops, an alias, a lifted call, a nested scope) and
updates a Variable; only the step's loss leaves the scope and is disposed by the loop.
"""

from __future__ import annotations

import argparse
import os
import resource
import time

import numpy as np

import tidyjax as tj
import tidyjax.numpy as tnp
from tidyjax import tidy


def rss_mib() -> float:
    """Current resident set size in MiB (Linux /proc; peak RSS elsewhere)."""
    try:
        with open(f"/proc/{os.getpid()}/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:  # pragma: no cover - not Linux
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--every", type=int, default=10_000)
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    x = tj.tensor(rng.normal(size=(64, 8)).astype(np.float32))
    y = tj.tensor(rng.normal(size=(64, 1)).astype(np.float32))
    w = tj.Variable(np.zeros((8, 1), np.float32), name="w")

    @tidy("step")
    def step() -> tj.Tensor:
        pred = x @ w
        err = pred - y
        alias = err[...]
        loss = tnp.mean(alias * alias)
        with tidy("grad"):
            g = (x.T @ err) * (2.0 / 64)
            w.assign(w - 0.01 * g)
        return loss

    print(f"{'step':>8} {'tensors':>8} {'buffers':>8} {'bytes':>8} {'RSS MiB':>9} {'steps/s':>9}")
    t0 = time.perf_counter()
    for i in range(1, args.steps + 1):
        step().dispose()
        if i % args.every == 0:
            m = tj.memory()
            rate = i / (time.perf_counter() - t0)
            print(f"{i:8d} {m.num_tensors:8d} {m.num_data_buffers:8d} {m.num_bytes:8d} "
                  f"{rss_mib():9.1f} {rate:9.0f}", flush=True)  # fmt: skip
    tj.dispose([x, y])
    tj.dispose_variables()
    print("final:", tj.memory())


if __name__ == "__main__":
    main()
