"""check_leaks counts device buffers, whatever array objects view them.

An allowed array allows every object over its buffer (printing a jax array makes one); a buffer
a raw array alone keeps alive is a leak, also after ``tensors()`` saw it (and ``memory()`` counts
such a caller's array as untracked again); the advice for plain arrays says what frees them.
"""

from __future__ import annotations

import gc

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tidyjax as tj

N = 1000  # float32: 4,000 bytes


@pytest.fixture
def step():
    fn = jax.jit(lambda x: (x * 2).sum())
    x = jnp.ones(100)
    fn(x).block_until_ready()  # compiled before any check
    return lambda: fn(x)


def test_a_loop_that_prints_its_loss_and_keeps_it_allowed_leaks_nothing(step, capsys):
    losses = []
    with tj.check_leaks() as checker:
        for _ in range(3):
            loss = step()
            print(loss)  # JAX makes a second array object over the loss's buffer
            losses.append(loss)
            checker.allow(loss)
    assert "200.0" in capsys.readouterr().out
    assert checker.report is not None and len(checker.report) == 0


def test_an_allowed_tensor_covers_the_objects_printing_it_makes(capsys):
    with tj.check_leaks() as checker:
        t = tj.tensor(np.ones(3, np.float32)) * 2
        print(t.array)
        checker.allow(t)
    assert checker.report is not None and len(checker.report) == 0
    capsys.readouterr()
    t.dispose()


def test_a_buffer_kept_alive_only_through_its_raw_array_is_reported():
    kept = []
    with pytest.raises(tj.LeakError) as err, tj.check_leaks():
        t = tj.tensor(np.ones(N, np.float32))
        kept.append(t.array)  # the Tensor goes, its buffer stays through the raw array
        del t
    report = err.value.report
    assert (len(report.tensors), len(report.arrays)) == (0, 1)
    assert report.num_bytes == 4 * N
    assert report.arrays[0].shape == (N,)
    kept.clear()
    gc.collect()
    assert tj.memory(scan_untracked=False).num_data_buffers == 0


def test_a_raw_array_and_the_view_printing_made_are_one_leak(capsys):
    kept = []
    with pytest.raises(tj.LeakError) as err, tj.check_leaks():
        raw = jnp.ones(N) + 1
        print(raw)
        kept.append(raw)
    capsys.readouterr()
    report = err.value.report
    assert (len(report.arrays), report.num_bytes) == (1, 4 * N)
    del raw
    kept.clear()


def test_an_array_once_seen_by_tensors_whose_tensor_died_is_the_callers_again():
    gc.collect()
    untracked_before = tj.memory().untracked_bytes or 0
    mine = []
    with pytest.raises(tj.LeakError) as err, tj.check_leaks():
        arr = jnp.ones(N) + 1
        t = tj.tensors(arr)  # a Tensor on the caller's array: tidyjax never deletes it
        del t
        mine.append(arr)
        del arr
    report = err.value.report
    assert (len(report.tensors), len(report.arrays)) == (0, 1)
    assert report.num_bytes == 4 * N
    gc.collect()
    info = tj.memory()
    assert (info.num_tensors, info.num_data_buffers, info.num_bytes) == (0, 0, 0)
    assert (info.untracked_bytes or 0) - untracked_before == 4 * N
    untracked = [r for r in tj.live_tensors(untracked=True) if r.scope == "<untracked>"]
    assert any(r.bytes == 4 * N and r.shape == (N,) for r in untracked)
    again = tj.tensors(mine[0])  # held by a Tensor again: tidyjax counts it
    info = tj.memory()
    assert (info.num_tensors, info.num_bytes) == (1, 4 * N)
    assert (info.untracked_bytes or 0) == untracked_before
    again.dispose()
    mine.clear()


def test_the_advice_for_plain_arrays_says_what_frees_them():
    kept = []
    with pytest.raises(tj.LeakError) as err, tj.check_leaks():
        kept.append(jnp.ones(3))
    text = str(err.value)
    assert "tidy scope that frees them" not in text
    assert "a tidy scope frees no plain jax array" in text and "drop the references" in text
    assert "tidyjax.lift" in text and "tidyjax.adopt(x)" in text
    assert "tidy scope frees no plain jax array" in err.value.report._repr_html_()
    kept.clear()
    with pytest.raises(tj.LeakError) as err, tj.check_leaks():
        kept.append(tj.tensor([1.0]))
    text = str(err.value)
    assert "inside a tidy scope that frees them" in text and "plain jax array" not in text
    tj.dispose(kept)
