"""plan() and largest_fitting(): XLA's compile-only figures for one call, set against what is
live on each device and its limit; nothing runs and nothing is allocated."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.errors import JaxRuntimeError
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import tidyjax as tj

from .conftest import UNDER_EIGHT, run_under_eight_devices

DEV = jax.devices()[0]
CPU_HAS_NO_LIMIT = not (DEV.memory_stats() or {}).get("bytes_limit")
N = 512
S = jax.ShapeDtypeStruct((N, N), jnp.float32)
NBYTES = N * N * np.dtype(np.float32).itemsize


def chain(x):
    return jnp.sin(x) @ jnp.cos(x)


def double(x):
    return x * 2.0 + 1.0


def mlp(x):
    """A batch of rows through two layers: what it takes grows with the batch."""
    w = jnp.ones((256, 512), x.dtype)
    return jnp.tanh(jnp.tanh(x @ w) @ w.T)


def rows(n: int) -> tuple[jax.ShapeDtypeStruct]:
    return (jax.ShapeDtypeStruct((n, 256), jnp.float32),)


# -- XLA's figures -----------------------------------------------------------------------------


def test_a_plan_of_structs_allocates_nothing_and_reads_xla_exactly():
    before = len(jax.live_arrays())
    p = tj.plan(chain, S)
    assert len(jax.live_arrays()) == before
    direct = jax.jit(chain).lower(S).compile().memory_analysis()
    assert p.argument_bytes == NBYTES == direct.argument_size_in_bytes
    assert p.output_bytes == NBYTES == direct.output_size_in_bytes
    assert p.temp_bytes == direct.temp_size_in_bytes > 0
    assert p.alias_bytes == 0
    assert p.peak_bytes == p.argument_bytes + p.output_bytes + p.temp_bytes - p.alias_bytes
    assert p.xla_peak_bytes == getattr(direct, "peak_memory_in_bytes", None)
    assert p.generated_code_bytes == direct.generated_code_size_in_bytes
    assert p.jitted == "whole" and p.function == "chain"
    assert "jitted whole by plan" in str(p)
    # one device: its figures are the top level's, the struct's bytes are all new
    assert p.devices == (str(DEV),) and p.device == str(DEV)
    for field in ("argument_bytes", "temp_bytes", "peak_bytes", "new_bytes", "live_bytes"):
        assert dict(p.per_device[field]) == {str(DEV): getattr(p, field)}
    assert p.new_bytes == p.peak_bytes  # nothing of the call is live yet


def test_tensors_and_arrays_are_read_for_their_shapes_and_count_as_live():
    t = tj.tensor(jnp.ones((N, N)))
    raw = jnp.ones((N, N))
    for arg in (t, raw):
        p = tj.plan(chain, arg)
        assert (p.argument_bytes, p.output_bytes) == (NBYTES, NBYTES)
        assert p.live_bytes == tj.memory().total_per_device[DEV] >= 2 * NBYTES
        buffers = {a.unsafe_buffer_pointer(): a.nbytes for a in jax.live_arrays()}
        assert p.live_bytes == sum(buffers.values())  # each buffer once
        assert p.new_bytes == p.output_bytes + p.temp_bytes  # the argument exists already
    # the largest holders on the device, by the line that made them
    (top,) = [h for h in p.holders if h.kind == "tensor"]
    assert top.bytes == NBYTES and top.site.file.endswith("test_plan.py")
    assert "test_plan.py" in str(p)
    del raw
    t.dispose()


def test_donation_of_a_jax_jit_aliases_and_lowers_the_peak():
    kept = tj.plan(jax.jit(double), S)
    donated = tj.plan(jax.jit(double, donate_argnums=0), S)
    assert kept.jitted == donated.jitted == "jax.jit"
    assert kept.alias_bytes == 0 and donated.alias_bytes == NBYTES
    assert donated.peak_bytes < kept.peak_bytes
    assert donated.new_bytes == kept.new_bytes - NBYTES


def test_donation_of_a_tidyjax_jit_aliases_and_the_tensor_survives_the_plan():
    t = tj.tensor(jnp.ones((N, N)))
    kept = tj.plan(tj.jit(double), t)
    donated = tj.plan(tj.jit(double, donate_argnums=0), t)
    assert kept.jitted == donated.jitted == "tidyjax.jit"
    assert donated.alias_bytes == NBYTES and donated.peak_bytes < kept.peak_bytes
    assert donated.new_bytes == 0  # its output takes the donated buffer
    assert not t.is_disposed and float(t[0, 0]) == 1.0  # planned, not run
    t.dispose()


def test_static_arguments_of_a_jit_are_used():
    def tile(x, n):
        return jnp.tile(x, n)

    for jitted in (jax.jit(tile, static_argnums=1), tj.jit(tile, static_argnums=1)):
        assert tj.plan(jitted, S, 3).output_bytes == 3 * NBYTES
    by_name = jax.jit(tile, static_argnames="n")
    assert tj.plan(by_name, x=S, n=2).output_bytes == 2 * NBYTES
    with pytest.raises(tj.TidyjaxTypeError, match="mark the other arguments static"):
        tj.plan(tile, S, 3)  # jitted whole: n is traced, and jnp.tile needs it concrete


# -- against the device ------------------------------------------------------------------------


def test_fits_against_a_limit():
    assert tj.plan(chain, S, limit=2**40).fits is True
    tight = tj.plan(chain, S, limit=1024)
    assert tight.fits is False and tight.limit_bytes == 1024
    assert "over" in str(tight) and "does not fit" in str(tight)
    assert dict(tight.per_device["fits"]) == {str(DEV): False}


@pytest.mark.skipif(not CPU_HAS_NO_LIMIT, reason="this backend reports a memory limit")
def test_fits_is_unknown_without_a_limit_on_cpu():
    p = tj.plan(chain, S)
    assert p.fits is None and p.limit_bytes is None
    assert any("pass limit=" in n for n in p.notes)


# -- largest_fitting ---------------------------------------------------------------------------


def test_largest_fitting_finds_the_exact_boundary():
    limit = 8 * 2**20
    lo, hi = 1, 4096
    n, p, compiles = tj.largest_fitting(mlp, rows, lo=lo, hi=hi, limit=limit)
    assert lo < n < hi
    assert tj.plan(mlp, *rows(n), limit=limit).fits is True
    assert tj.plan(mlp, *rows(n + 1), limit=limit).fits is False
    assert p.fits and p.new_bytes == tj.plan(mlp, *rows(n), limit=limit).new_bytes
    assert compiles <= math.ceil(math.log2(hi - lo + 1)) + 2


def test_largest_fitting_when_everything_fits_takes_two_compiles():
    n, p, compiles = tj.largest_fitting(mlp, rows, lo=1, hi=64, limit=2**40)
    assert (n, compiles) == (64, 2) and p.fits
    assert tj.largest_fitting(mlp, rows, lo=8, hi=8, limit=2**40)[::2] == (8, 1)


def test_largest_fitting_counts_a_compile_out_of_memory_as_not_fitting():
    class Tpu:
        """A jit whose compile runs out of memory above 100 rows, as XLA does on TPU."""

        def __call__(self, x):
            return mlp(x)

        def lower(self, x):
            lowered = jax.jit(mlp).lower(x)
            return _OutOfMemory() if x.shape[0] > 100 else lowered

    n, p, _ = tj.largest_fitting(Tpu(), rows, lo=1, hi=1000, limit=2**40)
    assert n == 100 and p.jitted == "lower"


def test_largest_fitting_refuses_an_unknown_limit_and_says_when_nothing_fits():
    if CPU_HAS_NO_LIMIT:
        with pytest.raises(tj.TidyjaxValueError, match=r"no memory limit is known.*pass limit="):
            tj.largest_fitting(mlp, rows, lo=1, hi=8)
    with pytest.raises(tj.TidyjaxValueError, match="nothing fits: already at lo=4") as e:
        tj.largest_fitting(mlp, rows, lo=4, hi=8, limit=1000)
    assert "MemoryPlan of mlp" in str(e.value)  # the plan at lo


def test_largest_fitting_bad_input():
    with pytest.raises(tj.TidyjaxValueError, match=r"lo \(9\) is larger than its hi \(3\)"):
        tj.largest_fitting(mlp, rows, lo=9, hi=3, limit=2**30)
    with pytest.raises(tj.TidyjaxTypeError, match=r"make_args\(1\) must return the tuple"):
        tj.largest_fitting(mlp, lambda n: rows(n)[0], lo=1, hi=3, limit=2**30)
    with pytest.raises(tj.TidyjaxTypeError, match="make_args takes a function"):
        tj.largest_fitting(mlp, 3, lo=1, hi=3, limit=2**30)
    with pytest.raises(tj.TidyjaxTypeError, match="lo must be an int >= 0"):
        tj.largest_fitting(mlp, rows, lo=1.5, hi=3, limit=2**30)


# -- errors ------------------------------------------------------------------------------------


def test_bad_input_names_the_problem_and_the_fix():
    with pytest.raises(tj.TidyjaxTypeError, match=r"plan\(\) takes a function.*got int 3"):
        tj.plan(3, S)
    with pytest.raises(tj.TidyjaxTypeError, match="could not lower chain") as e:
        tj.plan(chain, "not an array")
    assert "jax.ShapeDtypeStruct(shape, dtype)" in str(e.value)
    assert isinstance(e.value.__cause__, TypeError)
    with pytest.raises(tj.TidyjaxTypeError, match="limit must be an int >= 0, got str"):
        tj.plan(chain, S, limit="8 GB")
    t = tj.tensor(jnp.ones(3))
    t.dispose()
    with pytest.raises(tj.DisposedError):
        tj.plan(chain, t)

    @jax.jit
    def inside(x):
        return tj.plan(chain, x).peak_bytes

    with pytest.raises(tj.TidyjaxTypeError, match="got a traced value"):
        inside(jnp.ones((2, 2)))


class _OutOfMemory:
    """A lowered call whose compile fails as XLA's does when the program cannot fit."""

    def compile(self) -> Any:
        raise JaxRuntimeError("RESOURCE_EXHAUSTED: Ran out of memory in memory space hbm.")


def test_an_out_of_memory_compile_is_a_catchable_error():
    class Huge:
        def __call__(self, x):
            return x

        def lower(self, x):
            return _OutOfMemory()

    with pytest.raises(tj.OutOfMemoryError, match="ran out of memory compiling") as e:
        tj.plan(Huge(), S)
    assert isinstance(e.value, MemoryError) and "RESOURCE_EXHAUSTED" in str(e.value)


@dataclasses.dataclass
class _Reporting:
    """A compiled call whose memory analysis says what the test wants."""

    real: Any
    stats: Any

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def memory_analysis(self) -> Any:
        return self.stats


def _with_analysis(stats: Any) -> Any:
    class Jitted:
        def __call__(self, x):
            return chain(x)

        def lower(self, x):
            lowered = jax.jit(chain).lower(x)
            compiled = lowered.compile()
            lowered.compile = lambda: _Reporting(compiled, stats(compiled.memory_analysis()))
            return lowered

    return Jitted()


def test_figures_are_unknown_only_where_xla_says_nothing():
    none = tj.plan(_with_analysis(lambda real: None), S, limit=2**40)
    assert none.argument_bytes is none.temp_bytes is none.peak_bytes is None
    assert none.new_bytes is None and none.fits is None
    assert "unknown" in str(none) and "no memory analysis" in none.notes[0]

    @dataclasses.dataclass
    class Stats:
        argument_size_in_bytes: int = 0
        output_size_in_bytes: int = NBYTES
        temp_size_in_bytes: int = 0
        alias_size_in_bytes: int = 0
        generated_code_size_in_bytes: int = 0

    silent = tj.plan(_with_analysis(lambda real: Stats()), S, limit=2**40)
    assert silent.argument_bytes is None and silent.peak_bytes is None
    assert silent.temp_bytes == 0  # a temporary of 0 is an answer
    assert silent.output_bytes == NBYTES and silent.xla_peak_bytes is None
    assert "no bytes for the call's arguments" in silent.notes[0]


# -- displays ----------------------------------------------------------------------------------


def test_text_html_and_dict():
    t = tj.tensor(jnp.ones((N, N)))
    p = tj.plan(jax.jit(double, donate_argnums=0), t, limit=64 * 2**20)
    text = str(p)
    assert text.startswith("MemoryPlan of double on 1 device: fits")
    assert "arguments 1.0 MiB + outputs 1.0 MiB + temporaries 0 B - aliases 1.0 MiB" in text
    assert f"{DEV}: 1.0 MiB live" in text or "MiB live" in text
    assert repr(p).startswith("MemoryPlan(function='double', jitted='jax.jit'")
    page = p._repr_html_()
    assert "tidyjax memory plan" in page and "<table>" in page and "aliases" in page
    assert "test_plan.py" in page  # the largest holder
    broken = dataclasses.replace(p, per_device=None)  # a display never raises
    assert broken._repr_html_().startswith("<pre>")
    d = json.loads(json.dumps(p.to_dict()))
    assert d["alias_bytes"] == NBYTES and d["fits"] is True and d["jitted"] == "jax.jit"
    assert d["per_device"]["live_bytes"] == {str(DEV): p.live_bytes}
    assert d["holders"][0]["bytes"] == NBYTES
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.fits = False
    t.dispose()


# -- over eight devices ------------------------------------------------------------------------

EIGHT = len(jax.devices()) == 8
needs_eight = pytest.mark.skipif(not EIGHT, reason="needs 8 devices (test_under_eight_devices)")


@pytest.mark.skipif(
    jax.default_backend() != "gpu", reason="needs a GPU: compares a plan with the device's peak"
)
def test_a_plan_bounds_what_the_gpu_allocator_reaches():
    """On a GPU, running a planned call never takes the allocator's peak above what was in use
    before plus the plan's new bytes (outputs and temporaries, less donated arguments), with a
    margin for the allocator's rounding. ``peak_bytes_in_use`` is the process's high-water mark,
    so the check is against the larger of it and that sum. Not run on CPU runners."""
    dev = jax.devices()[0]
    step = tj.jit(lambda w, x: jnp.tanh(x @ w) @ w.T)
    w = tj.tensor(jnp.ones((2048, 2048), jnp.float32))
    x = tj.tensor(jnp.ones((4096, 2048), jnp.float32))
    jax.block_until_ready([w.array, x.array])
    p = tj.plan(step, w, x)
    step(w, x).dispose()  # compiled (and its own buffers settled) before the measured call
    before = dev.memory_stats()
    out = step(w, x)
    out.block_until_ready()
    after = dev.memory_stats()
    new = (p.output_bytes or 0) + (p.temp_bytes or 0) - (p.alias_bytes or 0)
    margin = 32 << 20  # allocator rounding and XLA's small scratch outside the analysis
    bound = max(before["peak_bytes_in_use"], before["bytes_in_use"] + new + margin)
    assert after["peak_bytes_in_use"] <= bound, (p, before, after)
    assert p.output_bytes == 4096 * 2048 * 4 and (p.temp_bytes or 0) >= 0
    tj.dispose([out, w, x])


@needs_eight
def test_eight_devices_give_per_device_figures():
    mesh = jax.make_mesh((8,), ("x",))
    rows_ = NamedSharding(mesh, P("x"))
    whole = NamedSharding(mesh, P())
    x = jax.ShapeDtypeStruct((1024, 256), jnp.float32, sharding=rows_)
    w = jax.ShapeDtypeStruct((256, 256), jnp.float32, sharding=whole)
    p = tj.plan(jax.jit(lambda x, w: jnp.tanh(x @ w)), x, w, limit=2**30)
    names = [str(d) for d in jax.devices()]
    assert sorted(p.devices) == sorted(names)
    shard = (1024 // 8) * 256 * 4
    assert p.argument_bytes == shard + 256 * 256 * 4 and p.output_bytes == shard
    for field in ("argument_bytes", "output_bytes", "new_bytes", "fits"):
        assert sorted(p.per_device[field]) == sorted(names)
    assert set(p.per_device["argument_bytes"].values()) == {p.argument_bytes}
    # a live sharded array counts on each device with its shard
    t = tj.tensor(jax.device_put(jnp.ones((1024, 256)), rows_))
    q = tj.plan(jax.jit(lambda x, w: jnp.tanh(x @ w)), t, w, limit=2**30)
    assert all(b >= shard for b in q.per_device["live_bytes"].values())
    assert q.new_bytes == p.new_bytes - shard  # its rows exist already
    t.dispose()


@needs_eight
def test_eight_devices_warn_of_structs_without_sharding():
    mesh = jax.make_mesh((8,), ("x",))
    x = jax.ShapeDtypeStruct((1024, 256), jnp.float32, sharding=NamedSharding(mesh, P("x")))
    bare = jax.ShapeDtypeStruct((256, 256), jnp.float32)
    with pytest.warns(UserWarning, match=r"over 8 devices, but 1 argument .* carries no sharding"):
        p = tj.plan(lambda x, w: x @ w, x, bare)
    assert any("sharding=NamedSharding" in n for n in p.notes)


@pytest.mark.skipif(EIGHT or UNDER_EIGHT, reason="runs itself")
def test_under_eight_devices() -> None:
    out = run_under_eight_devices(__file__, "-k", "eight")
    assert "2 passed" in out and "failed" not in out
