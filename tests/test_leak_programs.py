"""Issue 41's "Done when" on real programs, a fast subset of ``benchmarks/leak_programs.py``:
JAX's MNIST-from-scratch example, Flax NNX's MNIST tutorial (a 10-step window) and optax's
getting-started ``fit`` loop, ported on synthetic data with tiny shapes, each run under the leak
guide's recipe. With no leak planted the check is clean (loop variables and printed arrays listed
apart); with ``CACHE.append(...)`` planted once a step it finds exactly one array a step, in one
group whose chain holds the append's line."""

from __future__ import annotations

import importlib.util
import pathlib
import sys

import pytest

BENCHMARK = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "leak_programs.py"


@pytest.fixture(scope="module")
def programs():
    spec = importlib.util.spec_from_file_location("leak_programs", BENCHMARK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["leak_programs"] = module  # NNX and Equinox modules look theirs up by name
    spec.loader.exec_module(module)
    return module


# name: (steps, tiny shapes, the names the clean run lists apart); one shape for every batch
# and set where it can be: fewer eager compilations
MNIST = {"batch_size": 8, "hidden": 16, "num_train": 8, "num_test": 8}
CASES = {
    "fromscratch": (3, MNIST, ["train_acc", "test_acc"]),
    "nnx_mnist": (10, {"batch_size": 4, "widths": (10, 10, 10), "test_batches": 1}, []),
    "optax_fit": (3, {}, ["labels", "loss_value"]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_real_program_is_clean_and_its_planted_leak_is_found_by_its_chain(programs, name):
    steps, options, apart = CASES[name]
    result = programs.judge(name, steps, **options)
    clean, leaky = result["clean_report"], result["leak_report"]
    assert result["clean"], str(clean)
    assert [names for names, _ in clean.bound_locals] == apart
    assert result["planted"] == steps  # one array a step: the NNX window is 10 steps
    assert result["found"] == steps and len(leaky.arrays) == steps, str(leaky)
    assert result["named"], str(leaky)
    (group,) = leaky.array_groups
    line = programs.planted_lines()[name]
    assert f"leak_programs.py:{line} in " in group.site.label
    assert group.count == steps
    assert not programs.CACHE  # judge() lets go of what it planted
