"""profile(): the TF.js example's exact figures, nesting, peaks, kernels, scope reports."""

from __future__ import annotations

import logging

import pytest

import tidyjax as tj
import tidyjax.numpy as tnp
from tidyjax import tidy


def test_the_tfjs_example_exact_numbers():
    def body():
        x = tj.tensor([1.0, 2.0, 3.0])
        x2 = x.square()
        x2.dispose()
        x2 = x.square()
        x2.dispose()
        return x

    info = tj.profile(body)
    assert (info.new_bytes, info.new_tensors, info.peak_bytes) == (12, 1, 24)
    assert info.kernel_names == ["square"]
    assert len(info.kernels) == 2
    for k in info.kernels:
        assert (k.name, k.bytes_added, k.total_bytes_snapshot) == ("square", 12, 24)
        assert (k.tensors_added, k.total_tensors_snapshot) == (1, 2)
        assert k.input_shapes == [(3,)] and k.output_shapes == [(3,)]
        assert k.wall_time_ms >= 0
    assert isinstance(info.result, tj.Tensor)
    info.result.dispose()


def test_peak_is_right_even_when_no_op_ran_and_each_call_is_fresh():
    a = tj.tensor([1.0, 2.0])  # 8 bytes alive before the profile
    first = tj.profile(lambda: None)
    second = tj.profile(lambda: tj.tensor([1.0]))
    assert first is not second
    assert (first.peak_bytes, first.new_bytes, first.kernels) == (8, 0, [])
    assert (second.peak_bytes, second.new_bytes, second.kernel_names) == (12, 4, [])
    tj.dispose([a, second.result])


def test_nested_profiles_and_tensors_collected_without_dispose():
    with tj.profile() as outer:
        a = tj.tensor([1.0, 2.0])
        with tj.profile() as inner:
            b = a * 2
            c = b + 1
            c = c + 1  # the first c is collected, not disposed: its bytes go
        assert inner.kernel_names == ["mul", "add"]
    assert (inner.new_tensors, inner.new_bytes, inner.peak_bytes) == (2, 16, 32)
    assert (outer.new_tensors, outer.new_bytes, outer.peak_bytes) == (3, 24, 32)
    assert [k.name for k in outer.kernels] == ["mul", "add", "add"]
    tj.dispose([a, b, c])


def test_lifted_calls_and_scope_frees_are_seen():
    with tj.profile() as info:
        x = tnp.arange(4.0)
        with tidy():
            y = tnp.sin(x) * 2
            _ = tnp.sum(y)
    assert info.kernel_names == ["arange", "sin", "mul", "sum"]
    assert info.new_tensors == 1 and info.new_bytes == 16 and info.peak_bytes == 16 + 16 + 16
    assert info.kernels[3].output_shapes == [()]
    x.dispose()


def test_profiling_off_restores_the_plain_operators():
    plain = tj.Tensor.__add__
    with tj.profile():
        assert tj.Tensor.__add__ is not plain
    assert tj.Tensor.__add__ is plain


def test_profile_rejects_bad_input():
    with pytest.raises(tj.TidyjaxTypeError, match="function"):
        tj.profile(5)

    async def coro():
        return 1

    with pytest.raises(tj.TidyjaxTypeError, match="awaitable"):
        tj.profile(coro)


def test_scope_reports_created_freed_handed_out_and_peak():
    a = tj.tensor([1.0, 2.0])
    with tj.profile(), tidy("step") as s:
        b = a * 2
        with tidy("inner") as inner:
            c = inner.keep(b + 1)
        d = s.keep(c * 3)
    assert (s.num_created, s.num_freed, s.num_handed_out) == (2, 2, 1)
    assert (inner.num_created, inner.num_freed, inner.num_handed_out) == (1, 0, 1)
    assert s.peak_bytes == 8 * 4  # a, b, c, d alive at once
    with tidy() as plain:
        a + 1
    assert plain.peak_bytes is None and plain.num_created == 1
    tj.dispose([a, d])


def test_scope_exit_logs_one_debug_line(caplog):
    with caplog.at_level(logging.DEBUG, logger="tidyjax"), tidy("logged"):
        x = tj.tensor([1.0])
        y = x + 1
    lines = [r.getMessage() for r in caplog.records if r.name == "tidyjax"]
    assert len(lines) == 1
    assert "scope 'logged' exited" in lines[0] and "freed 2 buffers (8 bytes)" in lines[0]
    assert x.is_disposed and y.is_disposed


def test_many_disposals_in_one_profile_keep_exact_totals():
    # Freed records are collected during the profile; a new record may reuse a freed one's id.
    x = tj.tensor([1.0, 2.0, 3.0])
    with tj.profile() as info:
        for _ in range(300):
            y = x.square()
            y.dispose()
        for _ in range(300):
            z = x * 2  # rebinding: the previous z is collected without a dispose
    assert (info.new_tensors, info.new_bytes) == (1, 12)  # only the last z
    assert info.peak_bytes == 12 + 12 + 12  # x, the previous z, the new z
    assert len(info.kernels) == 600
    tj.dispose([x, z])
