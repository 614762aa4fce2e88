"""Notebooks you can predict: what ``%%tidy`` frees, where its Tensors were made, and what a
freed output says when it is used (IPython's real InteractiveShell)."""

from __future__ import annotations

import gc
import re
import weakref

import pytest

import tidyjax as tj

IPython = pytest.importorskip("IPython")
from IPython.core.interactiveshell import InteractiveShell  # noqa: E402


@pytest.fixture
def shell():
    sh = InteractiveShell.instance()
    sh.run_cell("%load_ext tidyjax", store_history=False)
    sh.run_cell("import tidyjax as tj, jax, jax.numpy as jnp", store_history=False)
    yield sh
    sh.run_cell("%tidyjax auto off", store_history=False)
    sh.reset(new_session=False)  # drop names and output history
    tj.dispose([v for v in list(sh.user_ns.values()) if isinstance(v, tj.Tensor)])
    gc.collect()


def cell(sh, code):
    """Run a numbered cell, as a notebook does; return its number (not its result, which would
    hold what it showed)."""
    result = sh.run_cell(code, store_history=True)
    assert result.error_before_exec is None and result.error_in_exec is None, result
    return result.execution_count


def plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)  # IPython colours its tracebacks


def placeholder(value) -> bool:
    return "deleted by tidyjax" in repr(value)


# -- 1. %%tidy frees what %%tidy cells showed, never an ordinary cell's output ----------------


def test_tidy_never_frees_what_an_ordinary_cell_showed(shell, capsys):
    n = cell(shell, "jnp.arange(3.0) * 10")
    m = cell(shell, "tj.tensor([1.0, 2.0]) * 2")
    shown = weakref.ref(shell.user_ns["Out"][m])
    cell(shell, "%%tidy\ny = jnp.ones(2)\ny * 3\n")  # frees its own y * 3 only
    cell(shell, "%%tidy\nz = 1\n")
    assert "freed 1 jax array" in capsys.readouterr().out
    cell(shell, f"x = _{n}")
    ns = shell.user_ns
    assert not placeholder(ns["x"]) and ns["x"].tolist() == [0.0, 10.0, 20.0]
    assert not shown().is_disposed and shown().tolist() == [2.0, 4.0]
    del ns["x"]
    # The explicit command frees what only the history holds, whoever showed it.
    capsys.readouterr()
    cell(shell, "%tidyjax free")
    assert "tidy: freed 1 buffer (8 B); kept 0; freed 1 jax array (12 B)" in capsys.readouterr().out
    assert placeholder(ns["Out"][n]) and placeholder(ns[f"_{n}"])
    assert shown() is None or shown().is_disposed


def test_auto_mode_frees_what_an_earlier_ordinary_cell_showed(shell):
    n = cell(shell, "jnp.arange(3.0) * 10")
    cell(shell, "%tidyjax auto on")
    cell(shell, "1 + 1")
    assert placeholder(shell.user_ns["Out"][n])
    cell(shell, "%tidyjax auto off")


def test_tidy_frees_an_earlier_tidy_cells_output_once_only_the_history_holds_it(shell, capsys):
    first = cell(shell, "%%tidy\nw = jnp.ones(256)\nw\n")  # w is named: kept
    assert "freed 0 buffers" in capsys.readouterr().out
    assert not shell.user_ns["w"].is_deleted()
    cell(shell, "%%tidy\nw = jnp.zeros(256)\nw\n")  # rebinds w: the old one only Out holds
    assert "freed 1 jax array (1.0 KiB)" in capsys.readouterr().out
    assert placeholder(shell.user_ns["Out"][first])
    assert shell.user_ns["w"].sum() == 0


def test_tidy_keeps_what_an_ordinary_output_also_holds(shell):
    n = cell(shell, "box = [jnp.ones(3)]\nbox")
    cell(shell, "del box")
    cell(shell, f"%%tidy\n_{n}[0]\n")  # the same array, now also this cell's output
    assert not placeholder(shell.user_ns["Out"][n])
    assert shell.user_ns["Out"][n][0].tolist() == [1.0, 1.0, 1.0]


# -- 2. a %%tidy cell's Tensors are named by that cell -----------------------------------------


def test_tidy_cell_sites_name_its_own_cell_and_line(shell):
    n = cell(shell, "%%tidy\na = tj.tensor([1.0])\n\nb = a * 2\n")
    cell(shell, "c = tj.tensor([3.0])")
    live = str(shell.run_cell("%tidyjax live", store_history=True).result)
    assert f"In[{n}], line 2 in <module>" in live  # the %%tidy line is the cell's line 1
    assert f"In[{n}], line 4 in <module>" in live
    assert f"In[{n + 1}], line 1 in <module>: 1 tensor" in live  # c only: not merged
    assert f"In[{n + 2}]" not in live


def test_tidy_cell_traceback_names_its_own_cell(shell, capsys):
    capsys.readouterr()
    result = shell.run_cell("%%tidy\nx = 1\nraise ValueError('here')\n", store_history=True)
    n = result.execution_count
    assert "raised ValueError: here" in str(result.error_in_exec)
    printed = plain(capsys.readouterr().out)
    assert f"In[{n}], line 3" in printed and f"In[{n + 1}]" not in printed


# -- 3. a freed output says who freed it and how to keep it ------------------------------------


def test_a_tensor_output_freed_by_tidy_says_so(shell):
    n = cell(shell, "%%tidy\nx = tj.tensor([1.0])\nx * 2\n")
    result = shell.run_cell(f"_{n} + 1", store_history=True)
    err = result.error_in_exec
    assert isinstance(err, tj.DisposedError), err
    msg = str(err)
    assert "%%tidy" in msg and f"In[{n}]" in msg and f"Out[{n}]" in msg
    assert "output history" in msg and "dispose()" not in msg
    assert "assign it to a name" in msg and "tidyjax.keep" in msg


def test_an_old_tensor_freed_by_free_or_auto_mode_says_so(shell):
    n = cell(shell, "y = tj.tensor([5.0])\ny")
    cell(shell, "y = None")
    cell(shell, "%tidyjax free")
    err = shell.run_cell(f"_{n} * 2").error_in_exec
    assert isinstance(err, tj.DisposedError) and "%tidyjax free" in str(err)
    assert "dispose()" not in str(err) and f"Out[{n}]" in str(err)

    cell(shell, "%tidyjax auto on")
    k = cell(shell, "tj.tensor([1.0]) * 2")  # the cell's own, only shown
    err = shell.run_cell(f"_{k} * 2").error_in_exec
    assert isinstance(err, tj.DisposedError) and "auto mode" in str(err)
    assert f"In[{k}]" in str(err) and "scope 'cell' exited" not in str(err)
    cell(shell, "%tidyjax auto off")


@pytest.mark.parametrize(
    "use", ["_{n} + 1", "1 + _{n}", "jnp.sin(_{n})", "_{n}.shape", "_{n}[0]", "float(_{n})"]
)
def test_a_freed_raw_output_raises_a_clear_error(shell, use):
    n = cell(shell, "%%tidy\njnp.ones(2)\n")
    assert placeholder(shell.user_ns[f"_{n}"])
    repr(shell.user_ns[f"_{n}"])  # showing it never raises
    cell(shell, f"_{n}")
    err = shell.run_cell(use.format(n=n)).error_in_exec
    assert isinstance(err, tj.DisposedError), repr(err)
    msg = str(err)
    assert f"Out[{n}]" in msg and "%%tidy" in msg and f"In[{n}]" in msg
    assert "assign it to a name" in msg
