from __future__ import annotations

import gc
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

import tidyjax as tj
from tidyjax._jaxdoors import BIND_CONVERSION

pytest_plugins = ["pytester"]

#: For tests of what raw JAX does with Tensors, which older JAX refuses (the docs say so).
needs_bind_hook = pytest.mark.skipif(
    not BIND_CONVERSION,
    reason="JAX before 0.10.2 has no hook to convert a Tensor at a primitive bind",
)

# Model-based tests: a fixed, sizeable budget in CI; `--hypothesis-profile=long` locally.
_slow = [HealthCheck.too_slow, HealthCheck.data_too_large]
settings.register_profile(
    "ci", max_examples=150, stateful_step_count=50, deadline=None, suppress_health_check=_slow
)
settings.register_profile(
    "long", max_examples=2000, stateful_step_count=80, deadline=None, suppress_health_check=_slow
)
settings.load_profile("ci")


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze everything alive after collection (modules, JAX, test objects) out of the collector.

    The teardown below runs a full ``gc.collect()`` after every test, and traversing the ~100k
    objects that imports leave cost more than most tests. ``gc.freeze()`` moves them into the
    permanent generation: later collections traverse only what tests create. This keeps the leak
    check's power: it counts tidyjax's registry (a record per live buffer), which sees frozen and
    unfrozen objects alike; freezing only stops the collector from traversing them. It can never
    free anything, so it cannot make a live Tensor look freed. No Tensor is alive at this point
    (the first teardown would report it), so no frozen object is a Tensor.
    """
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def _registry_is_empty_after_each_test():
    """Every test must leave no Tensor alive: it disposes what it made, or drops it."""
    yield
    from tidyjax._context import CURRENT

    assert CURRENT.get() is None, f"test left scope {CURRENT.get()!r} open"
    gc.collect()
    info = tj.memory(scan_untracked=False)
    assert info.num_tensors == 0, f"test left live tensors: {info!r}"
    assert info.num_data_buffers == 0


def run_threads(worker: Callable[[int], None], n: int, timeout: float = 120.0) -> None:
    """Run ``worker(0)`` .. ``worker(n - 1)`` in ``n`` threads at once; assert that every one
    ended within ``timeout`` seconds and raised nothing."""
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            worker(i)
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=timeout)
    assert not any(th.is_alive() for th in threads)
    assert errors == []


def counts() -> tuple[int, int, int]:
    """(num_tensors, num_data_buffers, num_bytes) now, after collecting garbage."""
    gc.collect()
    m = tj.memory(scan_untracked=False)
    return m.num_tensors, m.num_data_buffers, m.num_bytes


def line_of(marker: str, path: str | os.PathLike[str] | None = None) -> int:
    """The 1-based number of the first line containing ``marker`` in ``path``, by default the
    caller's own file (a test names its creation sites by a marker comment on their line, so
    that editing the file above them moves no expected line number)."""
    if path is None:
        path = sys._getframe(1).f_code.co_filename
    with open(path, encoding="utf-8") as f:
        for number, text in enumerate(f, 1):
            if marker in text:
                return number
    raise LookupError(f"no line of {path} contains {marker!r}")


def chromium() -> str:
    """Debian's chromium (or chromium-browser); skips where absent, fails in CI (.ci/run installs
    it)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("CI must install Debian's chromium for this test (see .ci/run).")
        pytest.skip("no chromium here: apt-get install chromium")
    return found


def tensors_at_sites(n: int, filename: str) -> list[tj.Tensor]:
    """n Tensors created on n different lines (creation sites) of ``filename``; the i-th holds
    (i + 1) KiB."""
    import numpy as np

    out = []
    for i in range(n):
        code = "\n" * i + f"t = tj.tensor(np.ones({256 * (i + 1)}, np.float32))"
        ns = {"tj": tj, "np": np}
        exec(compile(code, filename, "exec"), ns)
        out.append(ns["t"])
    return out


def walked_live_arrays(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Patch ``jax.live_arrays`` so that every array a caller walks through in its result is
    appended to the returned list (what a look at the live arrays costs in Python)."""
    import jax

    seen: list[Any] = []
    real = jax.live_arrays

    class Counting(list):  # type: ignore[type-arg]
        def __iter__(self) -> Any:
            for a in list.__iter__(self):
                seen.append(a)
                yield a

    monkeypatch.setattr(jax, "live_arrays", lambda p=None: Counting(real(p)))
    return seen


#: Set in the subprocess `run_under_eight_devices` starts: the test that starts it skips there.
UNDER_EIGHT = bool(os.environ.get("TIDYJAX_EIGHT"))


def computing_until_called_back(
    monkeypatch: pytest.MonkeyPatch, target: Callable[[], Any], callback: Callable[[], object]
) -> list[bool]:
    """Simulate, on CPU, a GPU computation with a host callback: the array ``target()`` reads
    as still being computed until ``callback`` returned, run on a thread the runtime made (as
    a host callback is) when the array is first waited for; that wait ends once it returned.
    Returns a list that gets whether it returned within 5 s (a report or a look that waited
    holding a lock the callback needs would leave it waiting: ``[False]``)."""
    import _thread

    from jax._src.array import ArrayImpl

    joined: list[bool] = []
    real_ready, real_block = ArrayImpl.is_ready, ArrayImpl.block_until_ready

    def is_ready(a: Any) -> bool:
        return bool(real_ready(a)) and not (a is target() and not joined)

    def block_until_ready(a: Any) -> Any:
        if a is target() and not joined:  # the computation ends once its callback returned
            done = threading.Event()

            def run() -> None:
                try:
                    callback()
                finally:
                    done.set()

            _thread.start_new_thread(run, ())
            joined.append(done.wait(timeout=5))
        return real_block(a)

    monkeypatch.setattr(ArrayImpl, "is_ready", is_ready)
    monkeypatch.setattr(ArrayImpl, "block_until_ready", block_until_ready)
    return joined


def run_under_eight_devices(path: str, *args: str) -> str:
    """Run pytest on ``path`` (with ``args``) in a subprocess under eight host devices; assert
    it passed and return its output. The multi-device tests of a file run this way from a test
    of its own, skipped in the subprocess (`UNDER_EIGHT`)."""
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", TIDYJAX_EIGHT="1")
    env.pop("JAX_PLATFORMS", None)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args, path],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    return proc.stdout
