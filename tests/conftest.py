from __future__ import annotations

import gc

import pytest
from hypothesis import HealthCheck, settings

import tidyjax as tj

pytest_plugins = ["pytester"]

# Model-based tests: a fixed, sizeable budget in CI; `--hypothesis-profile=long` locally.
_slow = [HealthCheck.too_slow, HealthCheck.data_too_large]
settings.register_profile(
    "ci", max_examples=150, stateful_step_count=50, deadline=None, suppress_health_check=_slow
)
settings.register_profile(
    "long", max_examples=2000, stateful_step_count=80, deadline=None, suppress_health_check=_slow
)
settings.load_profile("ci")


@pytest.fixture(autouse=True)
def _registry_is_empty_after_each_test():
    """Every test must leave no Tensor alive: it disposes what it made, or drops it."""
    yield
    from tidyjax._context import CURRENT

    assert CURRENT.get() is None, f"test left scope {CURRENT.get()!r} open"
    gc.collect()
    info = tj.memory(scan_untracked=False)
    assert info.num_tensors == 0, f"test left live tensors: {info!r}"
    assert info.num_data_buffers == 0


def counts() -> tuple[int, int, int]:
    """(num_tensors, num_data_buffers, num_bytes) now, after collecting garbage."""
    gc.collect()
    m = tj.memory(scan_untracked=False)
    return m.num_tensors, m.num_data_buffers, m.num_bytes
