"""memory(): counts, bytes per device, and when the figures are unreliable; and what
``watch``/``unwatch`` refuse (what holds no array, an unknown name)."""

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


# -- watch / unwatch ------------------------------------------------------------------------------


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
