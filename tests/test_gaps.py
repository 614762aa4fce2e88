"""Gaps where a Tensor or a tidyjax entry point did less than jax.Array or than its docs said:
errors that name the real problem, jax.Array's read-only attributes on Tensor, and buffers
deleted behind tidyjax's back."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tidyjax as tj
from tidyjax.__main__ import main as cli

# -- tensor(): what was wrong with the data or the device ---------------------------------------


def test_tensor_of_none_names_the_element_and_the_fix():
    with pytest.raises(tj.TidyjaxTypeError, match=r"None at data\[0\] .*None is not a number") as e:
        tj.tensor([None, 1.0])
    assert "float('nan')" in str(e.value) and "mask" in str(e.value)
    assert "ragged" not in str(e.value)
    with pytest.raises(tj.TidyjaxTypeError, match=r"None at data\[1\]\[0\] "):
        tj.tensor([[1.0, 2.0], [None]])
    with pytest.raises(tj.TidyjaxValueError, match="ragged nested sequence"):
        tj.tensor([[1, 2], [3]])  # really ragged: the message stays


def test_tensor_device_must_be_a_device_or_sharding():
    with pytest.raises(tj.TidyjaxTypeError) as e:
        tj.tensor([1.0], device="cpu")
    text = str(e.value)
    assert "jax.Device or a jax.sharding.Sharding" in text and "jax.devices('cpu')[0]" in text
    assert "got str 'cpu'" in text
    with pytest.raises(tj.TidyjaxTypeError, match=re.escape("jax.devices('cpu')[1]")):
        tj.tensor([1.0], device="cpu:1")
    with pytest.raises(tj.TidyjaxTypeError, match=r"jax\.Device or a jax\.sharding\.Sharding"):
        tj.tensor([1.0], device=object())
    t = tj.tensor([1.0], device=jax.devices("cpu")[0])
    assert t.device == jax.devices("cpu")[0]
    t.dispose()


# -- assign on a plain Tensor --------------------------------------------------------------------


def test_assign_on_a_plain_tensor_says_tensors_are_immutable():
    t = tj.tensor([1.0, 2.0])
    expected = (
        f"Tensor float32[2] (id {t.id}) is not a Variable; Tensors are immutable, like "
        "jax.Array. Make a Variable with tidyjax.Variable(t) to assign to it, or use the new "
        "value directly."
    )
    with pytest.raises(tj.TidyjaxTypeError) as e:
        t.assign(t * 2.0)
    assert str(e.value) == expected
    with pytest.raises(tj.TidyjaxTypeError, match="has no name to set"):
        t.name = "w"  # the other messages are unchanged
    t.dispose()


# -- snapshot files ------------------------------------------------------------------------------


def _record(**change):
    d = {
        "id": 1, "shape": [2], "dtype": "float32", "bytes": 8, "devices": ["TFRT_CPU_0"],
        "scope": "", "site": None, "kept": False, "variable": False, "buffer": 1, "name": None,
    }  # fmt: skip
    d.update(change)
    return {k: v for k, v in d.items() if v is not ...}


def _snapshot_file(tmp_path, tensors, name="s.json", **top):
    data = {"format": "tidyjax.snapshot", "version": 1, "taken_at": 0.0, "tensors": tensors}
    data.update(top)
    data = {k: v for k, v in data.items() if v is not ...}
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def test_snapshot_load_of_a_malformed_file_raises_a_tidyjax_error(tmp_path):
    path = _snapshot_file(tmp_path, [_record(), _record(shape=...)])
    with pytest.raises(tj.TidyjaxValueError) as e:
        tj.Snapshot.load(path)
    assert str(e.value) == (
        f"{path} is a malformed tidyjax snapshot: tensors[1] has no 'shape' field."
    )
    cases = [
        (_snapshot_file(tmp_path, [1], "a.json"), r"malformed tidyjax snapshot: tensors\[0\]"),
        (_snapshot_file(tmp_path, [_record(bytes="8")], "b.json"), r"tensors\[0\] is not as"),
        (_snapshot_file(tmp_path, [], "c.json", taken_at=...), "has no 'taken_at' field"),
        (_snapshot_file(tmp_path, [], "d.json", version=2), "format version 2"),
    ]
    (tmp_path / "e.json").write_text("[]")
    (tmp_path / "f.json").write_text("{not json")
    cases += [(tmp_path / "e.json", "not a tidyjax snapshot"), (tmp_path / "f.json", "not a JSON")]
    for file, message in cases:
        with pytest.raises(tj.TidyjaxValueError, match=message):
            tj.Snapshot.load(file)
    good = _snapshot_file(tmp_path, [_record()], "good.json")
    assert [r.shape for r in tj.Snapshot.load(good).records] == [(2,)]


def test_view_of_a_malformed_snapshot_exits_2_with_one_line(tmp_path, capsys):
    path = _snapshot_file(tmp_path, [1])
    proc = subprocess.run(
        [sys.executable, "-m", "tidyjax", "view", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.splitlines() == [
        f"tidyjax view: {path} is a malformed tidyjax snapshot: tensors[0] is not as written "
        "by dump() ('int' object has no attribute 'get')."
    ]
    assert not (tmp_path / "s.html").exists()
    bad = _snapshot_file(tmp_path, [_record(devices=5)], "bad.json")
    assert cli(["view", str(bad)]) == 2  # in process too: one line naming the file
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"tidyjax view: {bad} is a malformed tidyjax")


# -- watch / unwatch -----------------------------------------------------------------------------


@pytest.mark.parametrize("obj", [123, None, "text", 2.5])
def test_watch_refuses_what_holds_no_array(obj):
    with pytest.raises(tj.TidyjaxTypeError, match="watch\\(\\) takes an object that holds arrays"):
        tj.watch(obj, "gaps-scalar")
    assert "gaps-scalar" not in tj.memory(scan_untracked=False).watched


def test_watch_refuses_an_object_jax_sees_as_one_leaf():
    class Opaque:
        pass

    with pytest.raises(tj.TidyjaxTypeError, match="register its class as a pytree"):
        tj.watch(Opaque(), "gaps-opaque")


def test_unwatch_of_a_name_never_watched_lists_the_watched_names():
    params = tj.watch({"w": jnp.ones(2)}, "gaps-params")
    try:
        with pytest.raises(tj.TidyjaxValueError, match="never watched") as e:
            tj.unwatch("gaps-parms")
        assert "'gaps-params'" in str(e.value)
        assert tj.memory(scan_untracked=False).watched["gaps-params"] == 8
    finally:
        tj.unwatch("gaps-params")
    tj.unwatch("gaps-params")  # a name once watched: unwatching it again does nothing
    tj.unwatch(params)  # and an object, as before
    assert "gaps-params" not in tj.memory(scan_untracked=False).watched


# -- the pytest plugin: a bad option is one usage error at the start ----------------------------

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


# -- a Tensor reads like a jax.Array ---------------------------------------------------------------

SAME = ["itemsize", "committed", "weak_type", "is_fully_addressable", "is_fully_replicated",
        "format", "dtype", "shape", "ndim", "size", "nbytes", "sharding"]  # fmt: skip


@pytest.mark.parametrize("data", [[1.0, -2.5, 3.25], 1.0])
def test_tensor_metadata_matches_its_array(data):
    t = tj.tensor(data)
    a = t.array
    for name in SAME:
        assert getattr(t, name) == getattr(a, name), name
    assert t.is_ready() is a.is_ready() is True
    assert t.on_device_size_in_bytes() == a.on_device_size_in_bytes()
    assert t.copy_to_host_async() is None
    assert t.tobytes() == a.tobytes()
    assert t.__dlpack_device__() == a.__dlpack_device__()
    np.testing.assert_array_equal(np.from_dlpack(t), np.asarray(a))
    shards, raw = t.addressable_shards, a.addressable_shards
    assert [(s.device, s.index) for s in shards] == [(s.device, s.index) for s in raw]
    np.testing.assert_array_equal(np.asarray(shards[0].data), np.asarray(a))
    assert [s.device for s in t.global_shards] == [s.device for s in a.global_shards]
    np.testing.assert_array_equal(np.asarray(t.addressable_data(0)), np.asarray(a))
    assert t.is_deleted() is False
    t.dispose()


def test_round_in_and_mt_give_what_jax_array_gives():
    t = tj.tensor([[1.26, -2.5], [3.75, 0.1]])
    a = t.array
    for got, want in [(round(t), round(a)), (round(t, 1), round(a, 1)), (t.mT, a.mT)]:
        assert isinstance(got, tj.Tensor) and not got.is_disposed
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got.numpy(), np.asarray(want))
        got.dispose()
    row = t[0]
    assert (-2.5 in row) is True and (7.0 in row) is False
    with tj.tidy():
        r = round(t)
    assert r.is_disposed  # tracked: freed by its scope like every op result
    row.dispose()
    t.dispose()


def test_array_attributes_of_a_disposed_tensor():
    t = tj.tensor([1.0, 2.0])
    t.dispose()
    assert (t.itemsize, t.shape, t.dtype) == (4, (2,), jnp.float32)  # metadata stays
    for read in [lambda: t.committed, lambda: t.weak_type, lambda: t.is_ready(),
                 lambda: t.addressable_shards, lambda: t.copy_to_host_async(),
                 lambda: t.is_fully_replicated, lambda: np.from_dlpack(t),
                 lambda: t.__dlpack_device__(), lambda: round(t), lambda: t.tobytes()]:  # fmt: skip
        with pytest.raises(tj.DisposedError, match="disposed explicitly"):
            read()
    assert t.is_deleted() is True


def test_delete_on_a_tensor_points_to_dispose():
    t = tj.tensor([1.0, 2.0])
    with pytest.raises(tj.TidyjaxTypeError, match=r"has no delete\(\).*t\.dispose\(\)"):
        t.delete()
    assert not t.is_disposed and t.numpy().tolist() == [1.0, 2.0]
    t.dispose()


# -- buffers deleted behind tidyjax's back ---------------------------------------------------------


def test_is_disposed_notices_a_buffer_deleted_outside():
    t = tj.tensor([1.0, 2.0])
    t.array.delete()
    assert t.is_disposed  # before any use
    with pytest.raises(tj.DisposedError, match="deleted outside tidyjax"):
        t.numpy()
    t.dispose()


def test_is_disposed_notices_a_raw_donation():
    t = tj.tensor([1.0, 2.0])
    out = jax.jit(lambda x: x * 2, donate_argnums=0)(t.array)
    if not t._array.is_deleted():
        pytest.skip("this backend does not donate")
    assert t.is_disposed
    assert t.is_deleted()
    with pytest.raises(tj.DisposedError, match="deleted outside tidyjax"):
        t + 1.0
    np.testing.assert_array_equal(np.asarray(out), [2.0, 4.0])
    t.dispose()
