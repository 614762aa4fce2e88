"""check_leaks and the pytest plugin count plain jax.Arrays: ArrayMark, plain JAX, Equinox and
Flax NNX training loops with and without a leak (a list of per-step outputs); a bad plugin option
is one usage error at the start."""

from __future__ import annotations

import gc
import inspect
import os
import threading

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx

import tidyjax as tj
from tidyjax._newarrays import NEWEST, ArrayMark
from tidyjax._sites import INSTALLED_FOLDERS

from .conftest import line_of, walked_live_arrays

# Sites name files relative to the working directory when they lie under it.
HERE = os.path.relpath(__file__)
HERE = __file__ if HERE.startswith(os.pardir) else HERE


# -- the loops: each keeps its per-step output in LEAKS when asked to --------------------------

LEAKS: list = []
OPT = optax.sgd(0.1)


@jax.jit
def _plain_step(w, x):
    loss = lambda w: (jnp.tanh(x @ w) ** 2).mean()  # noqa: E731
    return w - 0.1 * jax.grad(loss)(w), jnp.tanh(x @ w)


def plain_loop(steps, leak):
    w, x = jnp.ones((16, 16)), jnp.ones((8, 16))
    for _ in range(steps):
        w, out = _plain_step(w, x)  # SITE:plain
        if leak:
            LEAKS.append(out)


@eqx.filter_jit
def _eqx_step(model, state, x):
    loss = lambda m: (jax.vmap(m)(x) ** 2).mean()  # noqa: E731
    grads = eqx.filter_grad(loss)(model)
    updates, state = OPT.update(grads, state, eqx.filter(model, eqx.is_array))
    return eqx.apply_updates(model, updates), state, jax.vmap(model)(x)


def eqx_loop(steps, leak):
    model = eqx.nn.MLP(4, 4, 16, 2, key=jax.random.key(0))
    state = OPT.init(eqx.filter(model, eqx.is_array))
    x = jnp.ones((8, 4))
    for _ in range(steps):
        model, state, recon = _eqx_step(model, state, x)  # SITE:eqx
        if leak:
            LEAKS.append(recon)


@nnx.jit
def _nnx_step(model, opt, x):
    loss = lambda m: ((m(x) - x) ** 2).mean()  # noqa: E731
    grads = nnx.grad(loss)(model)
    opt.update(model, grads)
    return model(x)


def nnx_loop(steps, leak):
    model = nnx.Linear(4, 4, rngs=nnx.Rngs(0))
    opt = nnx.Optimizer(model, OPT, wrt=nnx.Param)
    x = jnp.ones((8, 4))
    for _ in range(steps):
        recon = _nnx_step(model, opt, x)  # SITE:nnx
        if leak:
            LEAKS.append(recon)


LOOPS = {"plain": plain_loop, "eqx": eqx_loop, "nnx": nnx_loop}


@pytest.fixture(autouse=True)
def _no_leaks_left():
    yield
    LEAKS.clear()


# -- ArrayMark ---------------------------------------------------------------------------------


def test_array_mark_lists_the_arrays_made_since_newest_first():
    before = jnp.arange(3)
    mark = ArrayMark()
    assert mark.new() == []
    a = jnp.ones(2)
    b = a + 1
    tmp = a * 3
    del tmp  # dead: not listed
    assert [x is y for x, y in zip(mark.new(), [b, a], strict=True)] == [True, True]
    b.delete()  # deleted: not listed
    assert len(mark.new()) == 1 and mark.new()[0] is a
    assert all(x is not before for x in mark.new())
    key = jax.random.key(1)  # a typed key is listed as its words
    assert [(x.dtype, x.shape) for x in mark.new()] == [(jnp.uint32, (2,)), (a.dtype, (2,))]
    del key


def test_array_mark_when_the_newest_arrays_at_the_mark_died():
    # Earlier tests' garbage is collected first: an older array dying after the mark could
    # lend its id to a new one, the fallback's documented blind spot.
    gc.collect()
    earlier = jax.live_arrays()  # held: none of them can die during the test and lend its id
    old = [jnp.full(2, i) for i in range(5)]
    temps = [jnp.zeros(1) for _ in range(NEWEST + 3)]  # the newest at the mark, all to die
    newest = {id(a) for a in jax.live_arrays()[:NEWEST]}
    # The temps older than the newest stay alive: one dying after the mark could lend its id
    # to a new array, which the fallback takes for an old one (its documented blind spot).
    held = [a for a in temps if id(a) not in newest]
    mark = ArrayMark()
    del temps  # freed at once (no cycle): only the marked newest arrays die
    made = [jnp.ones(3) for _ in range(NEWEST + 5)]  # may reuse the dead arrays' ids
    new = mark.new()
    assert {id(a) for a in new} == {id(a) for a in made}
    assert not {id(a) for a in new} & {id(a) for a in old}
    del earlier, held


def test_array_mark_costs_nothing_per_old_array(monkeypatch):
    keep = [jnp.zeros(1) for _ in range(200)]
    mark = ArrayMark()
    seen = walked_live_arrays(monkeypatch)
    fresh = jnp.ones(1)
    new = mark.new()
    assert len(new) == 1 and new[0] is fresh
    assert len(seen) == 2  # the new array and the newest old one
    del keep


# -- check_leaks -------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(LOOPS))
def test_check_leaks_reports_a_leak_in_a_loop_at_the_users_line(kind):
    loop = LOOPS[kind]
    loop(1, leak=False)  # warm-up: compiled functions and library caches fill here
    with tj.check_leaks():
        loop(3, leak=False)
    with pytest.raises(tj.LeakError) as err, tj.check_leaks():
        loop(3, leak=True)  # SITE:call-loop
    report = err.value.report
    assert len(report) == 3 and len(report.arrays) == 3 and not report.tensors
    (group,) = report.array_groups
    # The site: the outermost user frame inside the block; the loop's line is its stack.
    call = f"{HERE}:{line_of('SITE:call-loop')} in {inspect.stack()[0].function}"
    line = line_of(f"SITE:{kind}")
    assert str(group.site) == call
    assert group.count == 3 and group.bytes == 3 * LEAKS[0].nbytes
    text = str(err.value)
    assert text.startswith("3 untracked arrays (")
    # grouped by the chain of user frames, outer to inner (issue 41)
    assert f"{call} → {HERE}:{line} in {kind}_loop: 3 untracked arrays" in text
    assert f"{HERE}:{line} in {kind}_loop (untracked)" in report._repr_html_()


def test_check_leaks_counts_tensors_and_arrays_apart_with_one_allowance():
    with pytest.raises(tj.LeakError) as err, tj.check_leaks(allowance=1, count_locals=True):
        t = tj.tensor([1.0, 2.0])
        raw = jnp.ones(4)  # SITE:raw
    report = err.value.report
    assert (len(report.tensors), len(report.arrays)) == (1, 1)
    assert report.num_bytes == 8 + 16
    assert str(err.value).startswith(
        "1 tensor (8 B) and 1 untracked array (16 B) created inside check_leaks() are still"
    )
    assert f"{HERE}:{line_of('SITE:raw')} in " in str(err.value)
    with tj.check_leaks(allowance=2, count_locals=True):
        t2 = tj.tensor([1.0, 2.0])
        raw2 = jnp.ones(4)
    with tj.check_leaks(arrays=False, count_locals=True):  # Tensors only
        raw3 = jnp.ones(4)
    tj.dispose([t, t2])
    del raw, raw2, raw3


def test_a_tensors_array_is_counted_once_as_the_tensor():
    with pytest.raises(tj.LeakError) as err, tj.check_leaks(count_locals=True):
        key = tj.random.key(0)  # jax.live_arrays lists its words, not the key
        t = tj.tensor([1.0]) * 2
    assert (len(err.value.report.tensors), len(err.value.report.arrays)) == (2, 0)
    tj.dispose([key, t])


def test_allowed_and_returned_arrays_are_no_leaks():
    with tj.check_leaks() as checker:
        kept = {"w": jnp.ones(3), "key": jax.random.key(0)}
        checker.allow(kept)
    assert checker.report is not None and len(checker.report) == 0

    @tj.check_leaks()
    def returns_raw():
        tmp = jnp.ones(3)
        return tmp + 1

    out = returns_raw()

    @tj.check_leaks(allow_returned=False)
    def returns_again():
        return jnp.ones(3)

    with pytest.raises(tj.LeakError):
        returns_again()
    del kept, out


def test_arrays_made_by_library_code_alone_are_not_counted(tmp_path):
    lib = os.path.join(INSTALLED_FOLDERS[0], "tidyjax_fake_lib_for_tests.py")
    ns: dict = {"jnp": jnp}
    exec(compile("def make(out):\n    out.append(jnp.ones(5))\n", lib, "exec"), ns)
    cache: list = []
    with tj.check_leaks():  # a thread running only library code: no user frame
        th = threading.Thread(target=ns["make"], args=(cache,))
        th.start()
        th.join()
    with pytest.raises(tj.LeakError, match="via "), tj.check_leaks():
        ns["make"](cache)  # called from here: the user's line, the library frame as detail
    assert len(cache) == 2


# -- the pytest plugin -------------------------------------------------------------------------

HEADER = """
import equinox as eqx
import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx

LEAKS = []
OPT = optax.sgd(0.1)
"""

PLUGIN_TESTS = (
    HEADER
    + "\n".join(
        inspect.getsource(f) for f in (_plain_step, plain_loop, _eqx_step, eqx_loop, _nnx_step)
    )
    + inspect.getsource(nnx_loop)
    + """
for warm in (plain_loop, eqx_loop, nnx_loop):  # warm-up: compile once, fill the caches
    warm(1, leak=False)

@pytest.mark.no_tensor_leaks
def test_plain_leak():
    plain_loop(3, leak=True)

@pytest.mark.no_tensor_leaks
def test_eqx_leak():
    eqx_loop(3, leak=True)

def test_nnx_leak():  # checked by --tidyjax-leaks
    nnx_loop(3, leak=True)

@pytest.mark.no_tensor_leaks(arrays=False)
def test_tensors_only():
    plain_loop(3, leak=True)

@pytest.mark.no_tensor_leaks(allowance=3)
def test_allowed():
    plain_loop(3, leak=True)

@pytest.mark.no_tensor_leaks
def test_plain_clean():
    plain_loop(3, leak=False)

@pytest.mark.no_tensor_leaks
def test_eqx_clean():
    eqx_loop(3, leak=False)

def test_nnx_clean():
    nnx_loop(3, leak=False)
"""
)


def test_plugin_reports_plain_array_leaks_at_the_test_files_line(pytester):
    written = pytester.makepyfile(test_loops=PLUGIN_TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--tidyjax-leaks")
    result.assert_outcomes(passed=5, failed=3)
    for kind in LOOPS:
        line = line_of(f"SITE:{kind}", written)
        call = line_of(f"def test_{kind}_leak", written) + 1  # the test's call of the loop
        result.stdout.fnmatch_lines(
            [
                f"*3 untracked arrays (*) created inside test test_{kind}_leak are still alive:*",
                f"*test_loops.py:{call} in test_{kind}_leak → test_loops.py:{line} in {kind}_loop: "
                "3 untracked arrays*",
            ]
        )
    for name in ("tensors_only", "allowed", "plain_clean", "eqx_clean", "nnx_clean"):
        result.stdout.no_fnmatch_line(f"*FAILED*test_{name}*")


def test_plugin_ini_turns_plain_arrays_off(pytester):
    pytester.makepyfile(test_loops=PLUGIN_TESTS)
    pytester.makeini("[pytest]\ntidyjax_leak_arrays = false\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-k", "plain or allowed")
    result.assert_outcomes(passed=3, deselected=5)


# -- the pytest plugin: a bad option is one usage error at the start ------------------------------


PLAIN_TESTS = """
import pytest

@pytest.mark.no_tensor_leaks
def test_one():
    pass

def test_two():
    pass
"""


@pytest.mark.parametrize(
    ("ini", "args", "message"),
    [
        ("tidyjax_leak_allowance = x", (), "ini option tidyjax_leak_allowance takes a number"),
        ("tidyjax_leak_allowance = -2", (), "a non-negative int; got '-2'"),
        ("tidyjax_leaks = maybe", (), "ini option tidyjax_leaks takes true or false"),
        ("", ("--tidyjax-leak-allowance=-1",), "--tidyjax-leak-allowance takes a number"),
    ],
)
def test_plugin_bad_option_is_one_usage_error(pytester, ini, args, message):
    pytester.makepyfile(test_plain=PLAIN_TESTS)
    pytester.makeini(f"[pytest]\n{ini}\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [ln for ln in result.stderr.lines if "tidyjax:" in ln]
    assert len(errors) == 1 and message in errors[0], result.stderr.str()
    assert "no_tensor_leaks" not in result.stderr.str()  # the marker is not blamed
    assert "passed" not in result.stdout.str() and "failed" not in result.stdout.str()
