from __future__ import annotations

import gc

import pytest

import tidyjax as tj


@pytest.fixture(autouse=True)
def _registry_is_empty_after_each_test():
    """Every test must leave no Tensor alive: it disposes what it made, or drops it."""
    yield
    gc.collect()
    info = tj.memory(scan_untracked=False)
    assert info.num_tensors == 0, f"test left live tensors: {info!r}"
    assert info.num_data_buffers == 0


def counts() -> tuple[int, int, int]:
    """(num_tensors, num_data_buffers, num_bytes) now, after collecting garbage."""
    gc.collect()
    m = tj.memory(scan_untracked=False)
    return m.num_tensors, m.num_data_buffers, m.num_bytes
