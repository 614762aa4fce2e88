"""What recording a timeline costs, and how a million events record, draw and load.

Run:  python benchmarks/timeline.py                 (about a minute on 2 CPU cores)
      python benchmarks/timeline.py --events 200000  (quicker)
      python benchmarks/timeline.py --screenshot out.png   (a standalone picture; the docs' and
                                                             README's come from docs/screenshots.py)

1. Eager ``a + b``: tidyjax over raw JAX with no timeline open, with one open, and after it
   closed, sampled in alternation (noise hits every side) and printed as ratios of medians: an
   open timeline's cost per op (goal: at most 2x the op) and a closed one's (goal: none; the
   registry's observer list is empty again, so the per-op path tests one empty list).
   The same for an empty ``with tidy(): pass`` (a scope enter and exit: two events, a look at
   the plain arrays made since, no Variable lookup when no Variable changed), with no
   Variables and with 200 named Variables alive, and with 1,000 or 10,000 plain arrays alive
   (each scope event reads ``jax.live_arrays()``).
2. 250,000 ops in one open timeline, beside the same ops with none: each side timed whole, with
   the full collections of Python's cyclic garbage collector counted (the rounds above are too
   short to see them).
3. A million events (half allocations, half frees) recorded from real ops; then the page
   rendered (its size), the JSON dumped and loaded, and the page loaded in headless Chromium
   (selenium and chromium-driver, when present) until its script has run.
"""

from __future__ import annotations

import argparse
import collections
import gc
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
from _timing import per_call

import tidyjax as tj
import tidyjax.numpy as tnp
from tidyjax import _registry


def overhead(number: int, rounds: int) -> None:
    print("== eager a + b: tidyjax / raw jax, with no timeline and with a timeline open ==")
    x, y = jnp.linspace(0.0, 1.0, 256), jnp.linspace(1.0, 2.0, 256)
    a, b = tj.tensor(x), tj.tensor(y)

    def raw() -> None:
        for _ in range(number):
            x + y

    def tidy() -> None:
        for _ in range(number):
            a + b

    def scopes() -> None:
        for _ in range(number // 4):
            with tj.tidy("s"):
                pass

    for _ in range(3):  # compile, warm the caches
        raw(), tidy(), scopes()
    sides = ("raw", "off", "on", "closed", "tidy off", "tidy on", "tidy closed", "vars off",
             "vars on")  # fmt: skip
    samples: dict[str, list[float]] = {k: [] for k in sides}
    n_scopes = number // 4
    for _ in range(rounds):  # every side in each round: the machine's noise hits them all
        samples["raw"].append(per_call(raw, 1) / number)
        samples["off"].append(per_call(tidy, 1) / number)
        samples["tidy off"].append(per_call(scopes, 1) / n_scopes)
        with tj.timeline(max_events=100_000):
            samples["on"].append(per_call(tidy, 1) / number)
            samples["tidy on"].append(per_call(scopes, 1) / n_scopes)
        assert not _registry.observers  # closed: no hook left on the op path
        samples["closed"].append(per_call(tidy, 1) / number)
        samples["tidy closed"].append(per_call(scopes, 1) / n_scopes)
        variables = [tj.Variable(jnp.zeros(4), name=f"v{i}") for i in range(200)]
        samples["vars off"].append(per_call(scopes, 1) / n_scopes)
        with tj.timeline(max_events=100_000):
            samples["vars on"].append(per_call(scopes, 1) / n_scopes)
        tj.dispose(variables)
        del variables  # their deleted arrays would slow jax.live_arrays() in the next round
    med = {k: statistics.median(v) * 1e6 for k, v in samples.items()}
    print(f"{'':34s} {'µs':>8s} {'/ raw':>7s}")
    print(f"{'raw jax a + b':34s} {med['raw']:8.2f} {1:7.2f}")
    print(f"{'tidyjax a + b, no timeline':34s} {med['off']:8.2f} {med['off'] / med['raw']:7.2f}")
    print(f"{'tidyjax a + b, timeline open':34s} {med['on']:8.2f} {med['on'] / med['raw']:7.2f}")
    print(f"{'tidyjax a + b, timeline closed':34s} {med['closed']:8.2f} "
          f"{med['closed'] / med['raw']:7.2f}")  # fmt: skip
    print(
        f"a timeline open: an op costs {med['on'] / med['off']:.2f}x the op without one "
        "(goal: at most 2x; median of the interleaved rounds)"
    )
    print(
        f"a timeline closed: an op costs {med['closed'] / med['off']:.2f}x the op before "
        "(goal: 1x, no timeline hook on the op path)"
    )
    print()
    print(f"{'empty with tidy(): pass':34s} {'µs':>8s} {'/ none':>7s}")
    rows = (("tidy off", "no timeline"), ("tidy on", "timeline open"),
            ("tidy closed", "timeline closed"), ("vars off", "200 Variables, no timeline"),
            ("vars on", "200 Variables, timeline open"))  # fmt: skip
    for key, label in rows:
        base = med["vars off"] if key.startswith("vars") else med["tidy off"]
        print(f"{label:34s} {med[key]:8.2f} {med[key] / base:7.2f}")
    print(
        f"a timeline open: an empty scope costs {med['tidy on'] / med['tidy off']:.2f}x the "
        f"scope without one ({med['vars on'] / med['vars off']:.2f}x with 200 Variables alive); "
        f"closed: {med['tidy closed'] / med['tidy off']:.2f}x"
    )
    tj.dispose([a, b])
    live_arrays_cost(number // 4, rounds)


def live_arrays_cost(number: int, rounds: int) -> None:
    """An empty scope with a timeline open while many plain jax.Arrays live: each scope event
    reads ``jax.live_arrays()``, whose cost grows with the arrays alive."""
    for n in (1_000, 10_000):
        alive = [jnp.zeros(1) + i for i in range(n)]
        jax.block_until_ready(alive)
        with tj.timeline(max_events=100_000):
            cost = statistics.median(per_call(_empty_scope, number) for _ in range(rounds))
        print(f"{f'timeline open, {n:,} arrays alive':34s} {cost * 1e6:8.2f}")
        del alive


def long_recording(ops: int) -> None:
    """``ops`` eager ops in one open timeline, beside the same ops with none, each side timed
    whole with the cyclic collector's full collections counted: what the medians of short
    rounds leave out, the collections a long recording's events cause."""
    a, b = tj.tensor(jnp.ones(256)), tj.tensor(jnp.ones(256))
    full = [0]

    def count(phase: str, info: dict[str, int]) -> None:
        full[0] += phase == "start" and info["generation"] == 2

    def run() -> tuple[float, int]:
        gc.collect()
        full[0] = 0
        t0 = time.perf_counter()
        for _ in range(ops):
            a + b
        return (time.perf_counter() - t0) / ops * 1e6, full[0]

    gc.callbacks.append(count)
    try:
        for _ in range(100):
            a + b
        off, off_full = run()
        with tj.timeline(max_events=4 * ops):
            on, on_full = run()
    finally:
        gc.callbacks.remove(count)
    tj.dispose([a, b])
    print(f"{f'{ops:,} ops, no timeline':34s} {off:8.2f} µs/op, {off_full} full GC collections")
    print(f"{f'{ops:,} ops, one timeline open':34s} {on:8.2f} µs/op, {on_full} full GC collections "
          f"({on / off:.2f}x)")  # fmt: skip


def _empty_scope() -> None:
    with tj.tidy("s"):
        pass


def _sites(k: int) -> list[object]:
    """k functions defined on k lines of "model.py": k creation sites."""
    out = []
    for i in range(k):
        ns: dict[str, object] = {}
        exec(compile("\n" * i + f"def f(x): return x * {i + 2}.0", "model.py", "exec"), ns)
        out.append(ns["f"])
    return out


def million(events: int, keep: pathlib.Path | None) -> None:
    print()
    print(f"== {events:,} events: record, render, dump, load ==")
    inputs = [tj.tensor(jnp.ones(64 * (k + 1))) for k in range(12)]
    makers = _sites(12)
    window: collections.deque[tj.Tensor] = collections.deque()
    for f, x in zip(makers, inputs, strict=True):  # compile
        f(x)
    with tj.timeline(max_events=events) as tl:
        t0 = time.perf_counter()
        i = 0
        with tj.tidy("run"):
            while len(tl._events) < events - 8:  # none dropped before max_events
                k = i % 12
                window.append(makers[k](inputs[k]))  # one allocation
                while len(window) > 50 + (i % 20_000) // 50:
                    window.popleft()  # collected: one free
                if i % 1000 == 0:
                    with tj.tidy("step"):
                        inputs[0] * 2.0  # freed at once by the scope
                i += 1
        window.clear()
        recorded = time.perf_counter() - t0
    n, seq = len(tl.events), len(tl._events) + tl.dropped
    print(f"recorded {seq:,} events in {recorded:.1f} s ({recorded / seq * 1e6:.1f} µs "
          f"per event, op included); {n:,} kept, {tl.dropped:,} older dropped")  # fmt: skip
    folder = keep or pathlib.Path(tempfile.mkdtemp())
    folder.mkdir(parents=True, exist_ok=True)
    page = folder / "timeline.html"
    t0 = time.perf_counter()
    tl.save_html(page)
    print(
        f"to_html + save: {time.perf_counter() - t0:.1f} s, page {page.stat().st_size / 1e6:.2f} MB"
    )
    data = folder / "timeline.json"
    t0 = time.perf_counter()
    tl.dump(data)
    dumped = time.perf_counter() - t0
    t0 = time.perf_counter()
    back = tj.Timeline.load(data)
    loaded = time.perf_counter() - t0
    print(f"dump {dumped:.1f} s ({data.stat().st_size / 1e6:.0f} MB JSON), load {loaded:.1f} s "
          f"({len(back.events):,} events)")  # fmt: skip
    del back, tl
    gc.collect()
    browser_load(page)
    tj.dispose(inputs)
    if keep is None:
        shutil.rmtree(folder)


def _driver() -> object | None:
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        return None
    chromedriver = shutil.which("chromedriver")
    binary = "/usr/lib/chromium/chromium"
    if chromedriver is None:
        return None
    options = Options()
    if os.path.exists(binary):
        options.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1180,900"):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(chromedriver), options=options)


def browser_load(page: pathlib.Path) -> None:
    driver = _driver()
    if driver is None:
        print("page load in a browser: skipped (needs selenium and chromium-driver)")
        return
    from selenium.webdriver.common.by import By

    try:
        t0 = time.perf_counter()
        driver.get(page.as_uri())  # type: ignore[attr-defined]
        driver.find_element(By.CSS_SELECTOR, ".tjtl[data-ready]")  # type: ignore[attr-defined]
        elapsed = time.perf_counter() - t0
        areas = len(driver.find_elements(By.CSS_SELECTOR, ".tj-area"))  # type: ignore[attr-defined]
        print(f"page loaded and drawn in headless Chromium: {elapsed:.2f} s ({areas} areas)")
    finally:
        driver.quit()  # type: ignore[attr-defined]


# -- the README picture -------------------------------------------------------------------------


def demo() -> tj.Timeline:
    """A small training run: parameters, steps with forward and update scopes, a leaky cache
    that grows, then an evaluation that peaks."""
    key = jax.random.key(0)
    k1, k2 = jax.random.split(key)
    params = [tj.Variable(jax.random.normal(k1, (512, 1024)), name="w1"),
              tj.Variable(jax.random.normal(k2, (1024, 256)), name="w2")]  # fmt: skip
    cache = []

    @tj.tidy("step")
    def step(x: tj.Tensor) -> tj.Tensor:
        with tj.tidy("forward"):
            h = tnp.tanh(x @ params[0])
            y = h @ params[1]
            loss = (y * y).mean()
        with tj.tidy("update"):
            for p in params:
                p.assign(p * 0.999)
        return loss

    with tj.timeline() as tl:
        with tj.tidy("train"):
            for i in range(30):
                x = tj.tensor(jnp.ones((256 * (1 + i % 3), 512)))
                loss = step(x)
                cache.append(tj.keep(x[:64]))  # a cache that is never emptied
        with tj.tidy("evaluate"):
            outs = [tnp.tanh(tj.tensor(jnp.ones((1024, 512))) @ params[0]) for _ in range(4)]
            del outs
        tj.dispose(cache)
        tj.dispose_variables()
    loss.dispose()
    return tl


def screenshot(path: pathlib.Path) -> None:
    tl = demo()
    page = path.resolve().with_suffix(".html")
    tl.save_html(page)
    driver = _driver()
    if driver is None:
        sys.exit("--screenshot needs selenium and chromium-driver")
    from selenium.webdriver.common.by import By

    try:
        driver.execute_cdp_cmd(  # type: ignore[attr-defined]
            "Emulation.setEmulatedMedia",
            {"features": [{"name": "prefers-color-scheme", "value": "light"}]},
        )
        driver.get(page.as_uri())  # type: ignore[attr-defined]
        root = driver.find_element(By.CSS_SELECTOR, ".tjtl[data-ready]")  # type: ignore[attr-defined]
        root.screenshot(str(path))
    finally:
        driver.quit()  # type: ignore[attr-defined]
    page.unlink()
    print(f"wrote {path} ({tl})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--number", type=int, default=2000, help="ops per sample")
    parser.add_argument("--rounds", type=int, default=15, help="samples per side")
    parser.add_argument("--events", type=int, default=1_000_000, help="events to record")
    parser.add_argument("--ops", type=int, default=250_000, help="ops of the long recording")
    parser.add_argument("--keep", type=pathlib.Path, help="a folder to keep the page and JSON in")
    parser.add_argument("--screenshot", type=pathlib.Path, help="only write the README picture")
    args = parser.parse_args()
    if args.screenshot:
        screenshot(args.screenshot)
        return
    print(f"jax {jax.__version__} on {jax.default_backend()}, tidyjax {tj.__version__}")
    overhead(args.number, args.rounds)
    long_recording(args.ops)
    million(args.events, args.keep)


if __name__ == "__main__":
    main()
