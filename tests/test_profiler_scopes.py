"""Scopes in JAX's own profiler: while a ``jax.profiler`` trace runs, each tidy scope is a
named range in it (``tidy <path>``); with no trace running a scope makes no annotation."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import tidyjax as tj
from tidyjax import _scope


def _trace_names(log_dir: Path) -> set[str]:
    (path,) = log_dir.glob("plugins/profile/*/perfetto_trace.json.gz")
    events = json.loads(gzip.decompress(path.read_bytes()))
    if isinstance(events, dict):
        events = events.get("traceEvents", [])
    return {e.get("name", "") for e in events}


def test_scopes_are_named_ranges_in_a_perfetto_trace(tmp_path: Path) -> None:
    with jax.profiler.trace(str(tmp_path), create_perfetto_trace=True), tj.tidy("train"):
        for _ in range(2):
            with tj.tidy("step") as step:
                assert step._annotation is not None  # open while the scope is
                (tj.tensor(jnp.ones(8)) * 2).block_until_ready()
            assert step._annotation is None  # ended at exit

        @tj.tidy("eval")
        def evaluate() -> None:
            (tj.tensor(jnp.ones(8)) + 1).block_until_ready()

        evaluate()
    names = _trace_names(tmp_path)
    assert {"tidy train", "tidy train/step", "tidy train/eval"} <= names


def test_a_scope_force_closed_by_its_parent_ends_its_range(tmp_path: Path) -> None:
    with jax.profiler.trace(str(tmp_path), create_perfetto_trace=True):
        outer = tj.tidy("outer")
        outer.__enter__()
        inner = tj.tidy("inner")
        inner.__enter__()
        with pytest.raises(tj.ScopeError):
            outer.__exit__(None, None, None)
        assert inner._annotation is None and outer._annotation is None
    assert {"tidy outer", "tidy outer/inner"} <= _trace_names(tmp_path)


def test_no_annotation_when_no_trace_runs() -> None:
    assert not _scope._profiling()
    with tj.tidy("quiet") as scope:
        assert scope._annotation is None
