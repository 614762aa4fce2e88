"""Every ```python example in README.md runs as written."""

from __future__ import annotations

import pathlib
import re

import pytest

from tidyjax._lift import PRIMITIVES_TAKE_TENSORS

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_readme_example_runs(code, capsys):
    if "# was: @jax.jit" in code and not PRIMITIVES_TAKE_TENSORS:
        pytest.skip("the standard step under tidyjax.jit needs JAX 0.10.2+ (README says so)")
    exec(compile(code, str(README), "exec"), {"__name__": "readme"})
    capsys.readouterr()


def test_readme_has_examples():
    assert len(BLOCKS) >= 1
