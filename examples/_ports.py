"""The harness the ported examples share: each port runs its plain-JAX loop and its tidyjax
loop alone (device memory after every step), then both interleaved (median step times).

A loop is a generator yielding ``(params, loss)`` after each step, so that the harness can
measure between steps. Imported by ``examples/port_*.py`` (run from any directory: a script's
own folder is on ``sys.path``).
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np

Loop = Callable[[int], Iterator[Any]]


def live_bytes() -> int:
    """Bytes held by every live ``jax.Array`` of this process (its device memory on CPU)."""
    return sum(a.nbytes for a in jax.live_arrays())


def run_alone(loop) -> tuple[int, float]:
    """Run a loop to its end; returns (live bytes after the last step minus after the first,
    the last loss)."""
    after = []
    for params, loss in loop:
        last = loss  # read only after the loop: float(jax.Array) makes an aliasing jax.Array
        jax.block_until_ready(params)
        after.append(live_bytes())
    del params, loss
    return after[-1] - after[0], float(np.ravel(last)[-1])


def time_interleaved(loops, steps: int, warmup: int = 3) -> tuple[float, float]:
    """Median step times (s) of ``loops[0]`` and ``loops[1]``: each a function making a loop of
    so many steps, the two stepped in alternation (which goes first alternates too), timed after
    ``warmup`` steps of each."""
    loops = [make(warmup + steps) for make in loops]
    times: dict[int, list[float]] = {0: [], 1: []}
    for i in range(warmup + steps):
        for k in (0, 1) if i % 2 == 0 else (1, 0):
            t0 = time.perf_counter()
            jax.block_until_ready(next(loops[k])[0])
            if i >= warmup:
                times[k].append(time.perf_counter() - t0)
    for loop in loops:
        for _ in loop:  # run each to its end: the port disposes its last parameters
            pass
    return statistics.median(times[0]), statistics.median(times[1])


def compare(train_plain: Loop, train_tidyjax: Loop, steps: int, timing_steps: int | None) -> dict:
    """Train both versions for ``steps`` steps each (memory), then time them interleaved."""
    plain_growth, plain_loss = run_alone(train_plain(steps))
    port_growth, port_loss = run_alone(train_tidyjax(steps))
    plain_s, port_s = time_interleaved(
        (train_plain, train_tidyjax), steps if timing_steps is None else timing_steps
    )
    return {
        "steps": steps,
        "plain_growth_bytes": plain_growth,
        "tidyjax_growth_bytes": port_growth,
        "ratio": port_s / plain_s,
        "final_loss_plain": plain_loss,
        "final_loss_tidyjax": port_loss,
        "plain_step_us": plain_s * 1e6,
        "tidyjax_step_us": port_s * 1e6,
    }


def report(name: str, r: dict) -> str:
    return (
        f"{name}: {r['steps']} steps\n"
        f"  device memory growth after step 1: plain {r['plain_growth_bytes']:,} bytes, "
        f"tidyjax {r['tidyjax_growth_bytes']:,} bytes\n"
        f"  median step time tidyjax / plain: {r['ratio']:.3f} "
        f"({r['tidyjax_step_us']:,.0f} / {r['plain_step_us']:,.0f} µs)\n"
        f"  final loss: plain {r['final_loss_plain']:.6f}, tidyjax {r['final_loss_tidyjax']:.6f}"
    )


def cli(file: str, doc: str, main: Callable[..., dict], size_help: str) -> None:
    """The command line every port has: ``--steps`` and ``--size``; prints the report."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--size", type=int, default=1, help=size_help)
    args = parser.parse_args()
    print(report(pathlib.Path(file).stem, main(steps=args.steps, size=args.size)))
