"""The four ported public example programs in examples/port_*.py: each runs its plain JAX loop
and its tidyjax port side by side; the plain one's device memory grows, the port's is flat, and
both reach the same loss. No timing assertions (the ratio is only reported)."""

from __future__ import annotations

import gc
import importlib.util
import pathlib
import subprocess
import sys

import pytest

import tidyjax as tj
from tidyjax._jaxdoors import BIND_CONVERSION

pytestmark = pytest.mark.skipif(
    not BIND_CONVERSION,
    reason="the ports run raw JAX transformations inside tidyjax.jit: JAX 0.10.2+",
)

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"

PORTS = [
    ("port_mnist_optax", ["optax"]),
    ("port_equinox_rnn", ["equinox", "optax"]),
    ("port_nnx_vae", ["flax", "optax"]),
    ("port_scan_fit", []),
]


def _load(name: str):
    if str(EXAMPLES) not in sys.path:  # as when run as a script: its folder has _ports.py
        sys.path.insert(0, str(EXAMPLES))
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses (eqx.Module) look their module up by name
    spec.loader.exec_module(module)
    return module


def _tensors() -> tuple[int, int]:
    gc.collect()
    m = tj.memory(scan_untracked=False)
    return m.num_tensors, m.num_data_buffers


@pytest.mark.parametrize(("name", "needs"), PORTS, ids=[name for name, _ in PORTS])
def test_port_plain_grows_tidyjax_flat_same_loss(name, needs):
    for package in needs:
        pytest.importorskip(package)
    example = _load(name)
    before = _tensors()
    result = example.main(steps=6)
    assert _tensors() == before  # the port disposed everything it made
    assert set(result) >= {
        "steps",
        "plain_growth_bytes",
        "tidyjax_growth_bytes",
        "ratio",
        "final_loss_plain",
        "final_loss_tidyjax",
    }
    assert result["steps"] == 6
    assert result["plain_growth_bytes"] > 0  # the plain loop's list of device arrays
    assert result["tidyjax_growth_bytes"] == 0
    assert result["final_loss_tidyjax"] == pytest.approx(result["final_loss_plain"], rel=1e-5)
    assert result["ratio"] > 0


def test_port_cli_runs():
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / "port_scan_fit.py"), "--steps", "3"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    assert "port_scan_fit: 3 steps" in out
    assert "tidyjax 0 bytes" in out
    assert "median step time tidyjax / plain" in out
