"""Sharded Tensors on 8 virtual CPU devices (a subprocess: the flag must precede jax's start)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import numpy as np
    import jax, jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import tidyjax as tj

    devs = jax.devices()
    assert len(devs) == 8, devs
    mesh = Mesh(np.array(devs), ("x",))
    split, replicated = NamedSharding(mesh, P("x")), NamedSharding(mesh, P())

    # a sharded tensor: each device holds its shard's bytes
    t = tj.tensor(np.arange(64, dtype=np.float32), device=split)
    assert t.sharding == split and len(t.devices()) == 8
    m = tj.memory()
    assert (m.num_tensors, m.num_data_buffers, m.num_bytes) == (1, 1, 256), m
    assert dict(m.bytes_per_device) == {d: 32 for d in devs}, m.bytes_per_device

    # replicated: a full copy on every device, counted once per device
    r = t.to(replicated)
    m = tj.memory()
    assert m.num_bytes == 256 + 256, m
    assert all(b == 32 + 256 for b in m.bytes_per_device.values()), m.bytes_per_device

    # moving to the sharding it already has shares the buffers: counted once
    same = t.to(split)
    m = tj.memory()
    assert (m.num_tensors, m.num_data_buffers, m.num_bytes) == (3, 2, 512), m

    # ops on sharded tensors are tracked and freed by scopes, every shard
    with tj.tidy():
        y = (t * 2).sum()
        z = t + 1
        shards = list(z.array._arrays)
        assert len(shards) == 8
    assert y.is_disposed and z.is_disposed and all(s.is_deleted() for s in shards)

    # dispose deletes every shard, only when no alias is alive
    t_shards = list(t.array._arrays)
    t.dispose()
    assert not any(s.is_deleted() for s in t_shards)  # `same` shares them
    np.testing.assert_array_equal(same.numpy(), np.arange(64))
    same.dispose()
    assert all(s.is_deleted() for s in t_shards)
    r.dispose()
    m = tj.memory()
    assert (m.num_tensors, m.num_bytes, dict(m.bytes_per_device)) == (0, 0, {}), m
    assert not m.unreliable, m.reasons

    # a scope owns sharded buffers too: escaped raw arrays lose every shard at exit, a returned
    # one moves out, and a sharded outer Tensor's clone leaves its shards alone
    outer = tj.tensor(np.arange(64, dtype=np.float32), device=split)
    escaped = []
    with tj.tidy():
        for i in range(5):
            escaped.append((outer * float(i)).array)  # the Tensors are collected at once
        m = tj.memory()
        assert (m.num_tensors, m.num_data_buffers, m.num_bytes) == (1, 6, 6 * 256), m
        assert dict(m.bytes_per_device) == {d: 6 * 32 for d in devs}, m.bytes_per_device
        back = tj.tidy.run(lambda: (outer + 1).array)
        c = outer.clone()
    assert all(a.is_deleted() for a in escaped) and back.is_deleted()
    assert c.is_disposed and not outer.is_disposed
    np.testing.assert_array_equal(outer.numpy(), np.arange(64))
    got = tj.tidy.run(lambda: (outer * 2).array)
    assert not got.is_deleted() and got.sharding == split
    del got, escaped, back
    outer.dispose()
    m = tj.memory()
    assert (m.num_tensors, m.num_data_buffers, m.num_bytes) == (0, 0, 0), m
    print("SHARDING OK")
    """
)


def test_sharded_tensors_on_eight_cpu_devices():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
    env.pop("JAX_PLATFORMS", None)
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SHARDING OK" in proc.stdout
