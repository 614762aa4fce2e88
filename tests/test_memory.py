"""memory(): counts, bytes per device, and when the figures are unreliable."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import tidyjax as tj


def test_counts_and_bytes_per_device():
    a = tj.tensor(jnp.zeros(10))
    b = a.clone()
    c = tj.tensor(jnp.zeros(5, jnp.int8))
    info = tj.memory()
    assert (info.num_tensors, info.num_data_buffers, info.num_bytes) == (3, 2, 45)
    assert dict(info.bytes_per_device) == {jax.devices()[0]: 45}
    assert not info.unreliable and info.reasons == () and info.untracked_arrays == 0
    assert info.device_stats == {}  # CPU reports no memory_stats
    assert "3 tensors, 2 buffers" in str(info)
    tj.dispose([a, b, c])
    assert tj.memory().num_bytes == 0


def test_info_is_immutable():
    info = tj.memory()
    with pytest.raises(AttributeError):
        info.num_tensors = 5
    assert info == tj.memory()


def test_untracked_jax_arrays_make_the_figure_unreliable():
    mine = jnp.ones(100)
    info = tj.memory()
    assert info.unreliable
    assert info.untracked_arrays >= 1 and info.untracked_bytes >= 400
    assert "not owned by tidyjax" in info.reasons[0]
    assert tj.memory(scan_untracked=False).untracked_arrays is None
    del mine


def test_memory_follows_garbage_collection():
    import gc

    t = tj.tensor([1.0, 2.0])
    assert tj.memory().num_tensors == 1
    del t
    gc.collect()
    assert tj.memory().num_tensors == 0
