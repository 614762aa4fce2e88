"""budget(): a tidyjax.jit call that would cross a device-memory budget raises BudgetError
before it runs; the pytest marker and ini option that run a test inside one.

Every limit is computed from ``tidyjax.plan`` of the same call, never a figure of one JAX
version: ``live + new`` is exactly what the check compares with the budget."""

from __future__ import annotations

import asyncio
import gc
import pickle
import threading
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tidyjax as tj
from tidyjax import _budget, _context

from .conftest import UNDER_EIGHT, run_under_eight_devices

DEV = jax.devices()[0]
N = 256
NBYTES = N * N * 4


def update(p):
    return p * 0.9 + 0.1


step = tj.jit(update)
donating = tj.jit(update, donate_argnums=0)


def need(fn: Any, *args: Any) -> int:
    """What the check compares with a per-device budget: live now + what the call adds."""
    gc.collect()  # no array waiting for the collector changes the figure meanwhile
    p = tj.plan(fn, *args)
    assert p.new_bytes is not None
    return p.live_bytes + p.new_bytes


def live_state() -> tuple[list[int], tj.MemoryInfo]:
    return sorted(id(a) for a in jax.live_arrays()), tj.memory()


@pytest.fixture
def w():
    t = tj.tensor(jnp.ones((N, N)))
    yield t
    t.dispose()


# -- the check ---------------------------------------------------------------------------------


def test_a_too_large_step_raises_before_anything_is_allocated(w):
    limit = need(step, w) - 1
    before = live_state()
    with pytest.raises(tj.BudgetError) as info, tj.budget(limit):
        step(w)
    assert live_state() == before  # no array made or freed, every count the same
    err = info.value
    assert isinstance(err, tj.OutOfMemoryError) and isinstance(err, MemoryError)
    p = tj.plan(step, w)
    assert (err.function, err.device, err.budget_bytes) == ("update", str(DEV), limit)
    assert (err.live_bytes, err.new_bytes) == (p.live_bytes, p.new_bytes)
    assert err.peak_bytes == limit + 1
    assert err.before_bytes == err.live_bytes  # all of it made before the budget
    assert isinstance(err.report, tj.MemoryPlan) and err.report.function == "update"
    text = str(err)
    assert "calling update" in text and str(DEV) in text
    assert "made before the budget" in text and "XLA temporaries" in text
    assert "test_budget.py" in text  # the largest holders, by the line that made them
    assert "donate_argnums" in text and "tidyjax.plan" in text  # the fix


def test_a_step_that_fits_runs_and_returns_the_right_values(w):
    with tj.budget(need(step, w)):  # exactly the need: fits
        out = step(w)
    np.testing.assert_allclose(out.numpy(), np.full((N, N), 1.0))
    out.dispose()


def test_arrays_made_inside_the_budget_are_named_apart(w):
    with tj.budget(need(step, w) + NBYTES - 1), pytest.raises(tj.BudgetError) as info:
        inside = tj.tensor(jnp.zeros((N, N)))
        step(w)
    inside.dispose()
    err = info.value
    assert err.live_bytes - err.before_bytes == NBYTES
    assert "0 B inside it" not in str(err)


def test_nested_budgets_the_tightest_wins(w):
    fits = need(step, w)
    for outer, inner in ((fits, fits - 1), (fits - 1, 10 * fits)):
        with tj.budget(outer), tj.budget(inner), pytest.raises(tj.BudgetError) as info:
            step(w)
        assert info.value.budget_bytes == fits - 1
    with tj.budget(fits):
        with tj.budget(fits - 1), pytest.raises(tj.BudgetError):
            step(w)
        out = step(w)  # the inner budget is gone
    out.dispose()


def test_the_decorator_form_runs_each_call_inside_the_budget(w):
    fits = need(step, w)

    @tj.budget(fits - 1)
    def too_small():
        return step(w)

    @tj.budget(fits)
    def enough():
        return step(w)

    with pytest.raises(tj.BudgetError):
        too_small()
    out = enough()
    out.dispose()
    assert _budget.BUDGETS.get() is None  # nothing left active
    assert enough.__name__ == "enough"


def test_an_async_function_decorated(w):
    @tj.budget(need(step, w) - 1)
    async def run():
        return step(w)

    with pytest.raises(tj.BudgetError):
        asyncio.run(run())


def test_donation_lowers_what_the_call_needs(w):
    kept, donated = need(step, w), need(donating, w)
    assert donated < kept  # the output reuses the donated buffer
    with tj.budget(kept - 1):
        with pytest.raises(tj.BudgetError):
            step(w)
        out = donating(w)  # fits only with w's buffer counted as reused
    assert w.is_disposed
    np.testing.assert_allclose(out.numpy(), np.full((N, N), 1.0))
    out.dispose()


def test_a_budget_across_devices(w):
    limit = need(step, w) - 1
    with tj.budget(limit, per_device=False), pytest.raises(tj.BudgetError) as info:
        step(w)
    assert info.value.device == "all devices" and "devices together" in str(info.value)
    assert tj.budget(limit, per_device=False).per_device is False


def test_a_plan_inside_a_budget_plans_against_it(w):
    fits = need(step, w)
    with tj.budget(fits - 1):
        p = tj.plan(step, w)
        assert p.limit_bytes == fits - 1 and p.fits is False
        assert tj.plan(step, w, limit=fits - 2).limit_bytes == fits - 2  # the smaller
    with tj.budget(fits - 1, per_device=False):  # plans are per device: not this one
        assert tj.plan(step, w).limit_bytes is None or tj.plan(step, w).limit_bytes >= fits


def test_a_call_inside_a_trace_is_not_planned_again(w):
    inner = tj.jit(lambda x: x * 2.0)
    outer = tj.jit(lambda x: inner(x) + 1.0)
    with tj.budget(need(outer, w)):
        out = outer(w)
    np.testing.assert_allclose(out.numpy(), np.full((N, N), 3.0))
    out.dispose()


def test_a_repeated_call_reads_the_figures_once_per_signature(w, monkeypatch):
    compiles = []
    real = _budget.call_figures

    def counting(*args: Any, **kwargs: Any) -> Any:
        compiles.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(_budget, "call_figures", counting)
    fn = tj.jit(lambda x, k: x * k, static_argnums=1)
    small = tj.tensor(jnp.ones((8,)))
    with tj.budget("1 GiB"):
        outs = [fn(w, 2), fn(w, 2), fn(w, 2)]
        assert len(compiles) == 1
        outs += [fn(small, 2), fn(w, 3), fn(small, 2)]
        assert len(compiles) == 3  # a new shape, a new static value
    tj.dispose([*outs, small])


def test_with_no_budget_no_call_is_checked(w, monkeypatch):
    def boom(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("checked")

    monkeypatch.setattr(_context, "check_budget", boom)
    monkeypatch.setattr(_budget, "call_figures", boom)
    out = step(w)  # neither runs
    out.dispose()
    with tj.budget("1 GiB"), pytest.raises(AssertionError, match="checked"):
        step(w)


def test_a_budget_in_one_thread_does_not_reach_another(w):
    too_small = need(step, w) - 1
    results: dict[str, Any] = {}

    def other(name: str) -> None:
        try:
            results[name] = step(w)
        except tj.BudgetError as e:
            results[name] = e

    def budgeted() -> None:
        with tj.budget(too_small):
            other("budgeted")

    with tj.budget(too_small):  # here, not in the thread started inside it
        t = threading.Thread(target=other, args=("free",))
        t.start()
        t.join()
    t = threading.Thread(target=budgeted)
    t.start()
    t.join()
    assert isinstance(results["free"], tj.Tensor)
    assert isinstance(results["budgeted"], tj.BudgetError)
    results["free"].dispose()
    out = step(w)  # and none here
    out.dispose()


def test_budget_error_pickles_with_its_report(w):
    with tj.budget(need(step, w) - 1), pytest.raises(tj.BudgetError) as info:
        step(w)
    err = info.value
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is tj.BudgetError and str(back) == str(err)
    assert back.report == err.report and back.report.holders == err.report.holders
    for field in ("function", "device", "budget_bytes", "live_bytes", "before_bytes",
                  "new_bytes", "peak_bytes"):  # fmt: skip
        assert getattr(back, field) == getattr(err, field)


def test_budgets_exited_out_of_order_raise():
    a, b = tj.budget(100), tj.budget(200)
    a.__enter__()
    b.__enter__()
    with pytest.raises(tj.ScopeError, match="innermost"):
        a.__exit__(None, None, None)
    b.__exit__(None, None, None)
    a.__exit__(None, None, None)
    assert _budget.BUDGETS.get() is None


# -- limits ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("2 GiB", 2 * 2**30),
        ("512 MiB", 512 * 2**20),
        ("2 GB", 2 * 10**9),
        ("1.5GB", 1_500_000_000),
        ("1 kib", 1024),
        (" 3 B ", 3),
        ("100", 100),
        ("0.5 KiB", 512),
        (4096, 4096),
        (np.int64(7), 7),
        (0, 0),
    ],
)
def test_limits_in_bytes_or_as_strings(given, expected):
    b = tj.budget(given)
    assert b.limit_bytes == expected and type(b.limit_bytes) is int
    assert "tidyjax.budget(" in repr(b)


@pytest.mark.parametrize(
    ("given", "error"),
    [
        ("2 gigs", tj.TidyjaxValueError),
        ("GiB", tj.TidyjaxValueError),
        ("1e9", tj.TidyjaxValueError),
        ("-1 GiB", tj.TidyjaxValueError),
        (-1, tj.TidyjaxValueError),
        (1.5e9, tj.TidyjaxTypeError),
        (True, tj.TidyjaxTypeError),
        (None, tj.TidyjaxTypeError),
    ],
)
def test_a_bad_limit_names_the_value_and_the_forms(given, error):
    with pytest.raises(error) as info:
        tj.budget(given)
    text = str(info.value)
    assert "tidyjax.budget()'s limit" in text and repr(given) in text
    assert "'2 GiB'" in text and "powers of 1024" in text


def test_a_bad_per_device_is_refused():
    with pytest.raises(tj.TidyjaxTypeError, match="per_device"):
        tj.budget(100, per_device="yes")  # type: ignore[arg-type]


# -- the pytest marker and ini option, run by pytest's own pytester ----------------------------

BUDGETED_TESTS = """
import jax.numpy as jnp
import pytest
import tidyjax as tj

@tj.jit
def grow(x):
    return jnp.tile(x, (64, 1))        # 64 times its argument

def run():
    x = tj.tensor(jnp.ones((256, 256)))   # 256 KiB
    out = grow(x)                          # 16 MiB out
    tj.dispose([x, out])

@pytest.mark.limit_device_memory("1 MiB")
def test_too_small():
    run()

@pytest.mark.limit_device_memory("1 GiB")
def test_enough():
    run()

def test_unmarked():
    run()
"""


def test_the_marker_fails_a_test_over_its_limit_and_passes_one_within(pytester):
    pytester.makepyfile(test_budgeted=BUDGETED_TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*test_too_small*",
            "*test test_too_small would cross its device memory limit of 1.0 MiB*",
            "*calling grow would take * to a peak of *, over the budget of 1.0 MiB*",
            "*largest live holders on*",
            "*test_budgeted.py:10 in run: 1 tensor, 256.0 KiB*",
        ]
    )
    out = result.stdout.str()
    assert "Traceback" not in out and "During handling" not in out
    # The report, printed once in the failure's section (the short summary repeats it in
    # full where pytest sees a CI: CI or BUILD_NUMBER set, no truncation).
    failures = out.split("short test summary info")[0]
    assert failures.count("calling grow would take") == 1


def test_the_ini_option_applies_to_every_test_and_the_marker_overrides_it(pytester):
    pytester.makepyfile(test_budgeted=BUDGETED_TESTS)
    pytester.makeini("[pytest]\ntidyjax_device_memory_limit = 2 MiB\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=2)  # test_unmarked too; test_enough's 1 GiB wins
    result.stdout.fnmatch_lines(["*FAILED*test_unmarked*"])
    pytester.makeini("[pytest]\ntidyjax_device_memory_limit = lots\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.stderr.fnmatch_lines(["*ini option tidyjax_device_memory_limit must be*'2 GiB'*'lots'*"])
    assert result.ret == pytest.ExitCode.USAGE_ERROR


# -- under eight devices ------------------------------------------------------------------------


@pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 devices (run under eight below)")
def test_a_budget_across_devices_names_a_replicated_holder_once() -> None:
    """A Tensor over four devices is one holder of the devices together, with its bytes on all
    of them (it was listed once per device, each time with one device's bytes)."""
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:4]), ("x",))
    big = tj.tensor(np.ones((N, N), np.float32)).to(NamedSharding(mesh, P()))
    square = tj.jit(lambda a: a @ a + 1.0)
    with tj.budget(NBYTES, per_device=False), pytest.raises(tj.BudgetError) as info:
        square(big)
    text = str(info.value)
    holders = text.split("largest live holders on this process's devices together:\n")[1]
    listed = [line for line in holders.splitlines() if line.startswith("    ")]
    assert len(listed) == 1, text
    assert "1 tensor, 1.0 MiB [float32[256,256]]" in listed[0], text  # 4 x 256 KiB
    big.dispose()


@pytest.mark.skipif(len(jax.devices()) >= 8 or UNDER_EIGHT, reason="runs itself")
def test_under_eight_devices() -> None:
    out = run_under_eight_devices(__file__, "-k", "names_a_replicated_holder_once")
    assert "1 passed" in out, out
