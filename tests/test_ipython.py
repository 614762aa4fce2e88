"""The IPython extension through IPython's InteractiveShell, and the rich displays.

Also: notebooks you can predict: what ``%%tidy`` frees (never an ordinary cell's output), where
its Tensors were made, and what a freed output says when it is used."""

from __future__ import annotations

import gc
import re
import weakref

import jax
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


def live_buffers() -> int:
    """Distinct device buffers alive (JAX may keep several array objects over one buffer)."""
    return len({a.unsafe_buffer_pointer() for a in jax.live_arrays() if not a.is_deleted()})


def run(sh, code):
    result = sh.run_cell(code)
    assert result.error_before_exec is None and result.error_in_exec is None, result
    return result


def test_tidy_cell_magic_keeps_what_names_hold_and_frees_the_rest(shell, capsys):
    capsys.readouterr()
    run(
        shell,
        """%%tidy step
a = tj.tensor([1.0, 2.0])
b = a * 2
results = [b + 1]
class Model: pass
model = Model(); model.w = b * 10
tmp = a + 100
del tmp
b * 100
""",
    )
    out = capsys.readouterr().out
    assert "tidy: freed 1 buffer (8 B); kept 4" in out  # b*100; a+100 went with `del`
    ns = shell.user_ns
    for name in ("a", "b"):
        assert not ns[name].is_disposed
    assert not ns["results"][0].is_disposed and not ns["model"].w.is_disposed
    assert ns["_"].is_disposed  # shown, in Out[] and `_`, yet freed
    assert "disposed" in ns["_"]._repr_html_()
    assert tj.memory().num_tensors == 4


def test_tidy_cell_magic_quiet_and_errors_still_free(shell, capsys):
    capsys.readouterr()
    run(shell, "%%tidy -q\nx = tj.tensor([1.0])\ny = x * 2\n")
    assert capsys.readouterr().out == ""
    result = shell.run_cell("%%tidy\nz = tj.tensor([3.0])\nw = z * 2\nraise ValueError('cell')\n")
    assert "raised ValueError: cell" in str(result.error_in_exec)  # the cell fails too
    # names bound before the error survive; the traceback does not keep anything alive
    assert not shell.user_ns["w"].is_disposed
    bad = shell.run_cell("%%tidy too many\nx = 1\n")
    assert "usage: %%tidy [name] [-q]" in str(bad.error_in_exec)
    assert "usage: %tidyjax" in str(shell.run_cell("%tidyjax nonsense").error_in_exec)


def test_auto_mode_scopes_every_cell_and_frees_rebound_values_nobody_holds(shell):
    run(shell, "%tidyjax auto on")
    run(shell, "x = tj.tensor([1.0]) * 3")  # the tj.tensor temporary is freed by the cell
    run(shell, "x")  # shown: now Out[] and `_` hold it
    old = weakref.ref(shell.user_ns["x"])
    run(shell, "x = tj.tensor([5.0])")
    assert old() is None or old().is_disposed  # only the output history held it

    run(shell, "y = x")
    held = weakref.ref(shell.user_ns["x"])
    run(shell, "x = tj.tensor([6.0])")
    assert not held().is_disposed  # y still refers to it
    run(shell, "keep = {'k': [x]}")
    kept = weakref.ref(shell.user_ns["x"])
    run(shell, "del x")
    assert not kept().is_disposed  # inside another user value
    run(shell, "%tidyjax auto off")
    from tidyjax._context import CURRENT

    assert CURRENT.get() is None  # turning auto off closed its cell scope
    run(shell, "q = tj.tensor([1.0]) * 2")
    assert tj.memory().num_tensors == 3  # y, the tensor in `keep`, q


def test_memory_and_live_line_magics(shell):
    cell = shell.execution_count
    run(shell, "t = tj.tensor([1.0, 2.0, 3.0])")
    info = run(shell, "%tidyjax memory").result
    assert isinstance(info, tj.MemoryInfo) and info.num_tensors == 1
    assert "tidyjax memory" in info._repr_html_() and "<table" in info._repr_html_()
    live = run(shell, "%tidyjax live").result
    assert isinstance(live, tj.Snapshot) and len(live.records) == 1
    # the site is named as IPython's tracebacks name a cell, not by its file name
    assert f"In[{cell}], line 1 in " in str(live) and f"In[{cell}], line 1" in live._repr_html_()
    assert "ipython-input" not in str(live) + live._repr_html_()


def test_rich_displays_never_raise_and_show_the_essentials():
    t = tj.tensor([[1.0, 2.0], [3.0, 4.0]])
    html = t._repr_html_()
    assert "float32[2,2]" in html and "16 B" in html and "cpu" in html.lower()
    assert "3. 4." in html
    v = tj.Variable([1.0], name="w")
    assert "Variable" in v._repr_html_() and "&#x27;w&#x27;" in v._repr_html_()
    p = tj.profile(lambda: t * 2)
    assert "<table" in p._repr_html_() and "mul" in p._repr_html_()
    with pytest.raises(tj.LeakError) as err, tj.check_leaks(count_locals=True):
        leaked = t + 1
    assert "leak" in err.value.report._repr_html_()
    big = tj.tensor([0.0] * 1000)
    assert "..." in big._repr_html_()  # summarised, not 1000 values
    tj.dispose([t, v, p.result, leaked, big])
    assert "disposed" in t._repr_html_()


def test_auto_mode_never_frees_an_old_value_another_name_still_binds(shell):
    run(shell, "%tidyjax auto on")
    run(shell, "a = [tj.tensor([1.0])]")
    run(shell, "b = a")
    run(shell, "del a")  # the list is still bound to b
    assert not shell.user_ns["b"][0].is_disposed
    run(shell, "c = {'k': b}")
    run(shell, "b = None")  # still reachable inside c
    assert not shell.user_ns["c"]["k"][0].is_disposed
    run(shell, "%tidyjax auto off")


# -- what only IPython's output history holds is freed; what a user name reaches is kept ------


def run_numbered(sh, code):
    """Run a cell as a notebook does: numbered, in the history, with its output in ``Out``."""
    result = sh.run_cell(code, store_history=True)
    assert result.error_before_exec is None and result.error_in_exec is None, result
    return result


def freed_output(value) -> bool:
    return "deleted by tidyjax" in repr(value)


@pytest.mark.parametrize("last", ["x * 2, x * 3", "[x * 2, x * 3]", "{'a': x * 2, 'b': x * 3}"])
def test_tidy_frees_new_tensors_a_shown_container_holds(shell, capsys, last):
    run(shell, "x = tj.tensor([1.0, 2.0])")
    capsys.readouterr()
    run(shell, f"%%tidy\n{last}\n")
    assert "tidy: freed 2 buffers (16 B); kept 0" in capsys.readouterr().out
    shown = shell.user_ns["_"]
    assert all(t.is_disposed for t in (shown.values() if isinstance(shown, dict) else shown))
    assert tj.memory().num_tensors == 1  # x


def test_auto_mode_frees_a_shown_tuple_of_new_tensors(shell):
    run(shell, "%tidyjax auto on")
    run(shell, "x = tj.tensor([1.0, 2.0])")
    run(shell, "loss, acc = x.sum(), x.mean()\nloss, acc")  # shown, and named: kept
    run(shell, "x * 2, x * 3")
    assert all(t.is_disposed for t in shell.user_ns["_"])
    assert not shell.user_ns["loss"].is_disposed and not shell.user_ns["acc"].is_disposed
    run(shell, "%tidyjax auto off")
    assert tj.memory().num_tensors == 3


def test_what_only_underscores_and_out_hold_is_freed(shell):
    shell.ast_node_interactivity = "all"  # every expression shown: `__` holds the first
    try:
        run_numbered(shell, "%%tidy\nx = tj.tensor([1.0])\nx * 2\nx * 3\n")
    finally:
        shell.ast_node_interactivity = "last_expr"
    ns = shell.user_ns
    n = shell.execution_count - 1
    assert ns["_"] is ns["Out"][n] is ns[f"_{n}"] and ns["_"].is_disposed
    assert ns["__"].is_disposed and not ns["x"].is_disposed
    # A value an earlier %%tidy cell showed, now in Out[n] and `___` only, goes when its name
    # is rebound.
    run_numbered(shell, "%%tidy\ny = tj.tensor([5.0])\ny")
    shown = weakref.ref(ns["_"])  # a strong reference here would be a holder
    run_numbered(shell, "1")
    run_numbered(shell, "2")
    assert ns["___"] is shown() and not shown().is_disposed
    run_numbered(shell, "%%tidy\ny = tj.tensor([6.0])\n")
    assert shown().is_disposed and not ns["y"].is_disposed
    assert tj.memory().num_tensors == 2
    # One an ordinary cell showed is not %%tidy's: `%tidyjax free` (or auto mode) frees it.
    run_numbered(shell, "z = tj.tensor([7.0])\nz")
    shown = weakref.ref(ns["_"])
    run_numbered(shell, "%%tidy\nz = tj.tensor([8.0])\n")
    assert not shown().is_disposed
    run_numbered(shell, "%tidyjax free")
    assert shown().is_disposed and not ns["z"].is_disposed
    assert tj.memory().num_tensors == 3


def test_what_a_user_name_reaches_through_any_object_is_kept(shell, capsys):
    capsys.readouterr()
    run(
        shell,
        """%%tidy
import numpy as np
in_list = [tj.tensor([1.0])]
in_dict = {"k": [tj.tensor([2.0])]}
in_array = np.empty(2, dtype=object); in_array[0] = tj.tensor([3.0])
whole = np.empty((2, 2), dtype=object); whole[1, 1] = tj.tensor([4.0])
in_view = whole[1:]
del whole
class Box: pass
box = Box(); box.w = tj.tensor([5.0])
def make():
    c = tj.tensor([6.0])
    return lambda: c
closure = make()
class Key:
    def __init__(self, t): self.t = t
in_set = {Key(tj.tensor([7.0]))}
in_list, in_array, box
""",
    )
    assert "tidy: freed 0 buffers (0 B); kept 7" in capsys.readouterr().out
    ns = shell.user_ns
    kept = [
        ns["in_list"][0],
        ns["in_dict"]["k"][0],
        ns["in_array"][0],
        ns["in_view"][0, 1],
        ns["box"].w,
        ns["closure"](),
        next(iter(ns["in_set"])).t,
    ]
    assert not any(t.is_disposed for t in kept)
    assert float(ns["in_array"][0].item()) == 3.0
    tj.dispose(kept)


def test_plain_jax_arrays_only_the_history_holds_are_deleted(shell, capsys):
    run(shell, "import jax.numpy as jnp")
    before = live_buffers()
    capsys.readouterr()
    run_numbered(shell, "%%tidy\nw = jnp.ones(1000)\nw * 2, w.sum()\n")
    assert "tidy: freed 2 jax arrays (3.9 KiB)" in capsys.readouterr().out
    ns = shell.user_ns
    n = shell.execution_count - 1
    assert not ns["w"].is_deleted()  # bound to a name
    assert float(ns["w"].sum()) == 1000.0
    # The history no longer points at deleted arrays: showing it again never raises.
    for value in (ns["_"], ns["Out"][n], ns[f"_{n}"], shell.displayhook._):
        assert freed_output(value), value
    assert "tuple" in repr(ns["_"])
    assert live_buffers() == before + 1  # w
    run(shell, "%%tidy -q\nw.sum()\n")
    assert live_buffers() == before + 1


def test_one_jax_array_in_the_summary(shell, capsys):
    run(shell, "import jax.numpy as jnp")
    capsys.readouterr()
    run(shell, "%%tidy\njnp.zeros(2)\n")
    assert capsys.readouterr().out.strip().endswith("tidy: freed 1 jax array (8 B)")
    run(shell, "%%tidy\nt = tj.tensor([1.0])\nt * 2, jnp.zeros(3)\n")
    out = capsys.readouterr().out
    assert "tidy: freed 1 buffer (4 B); kept 1; freed 1 jax array (12 B)" in out


def test_arrays_only_a_traceback_holds_are_deleted(shell, capsys):
    run(
        shell,
        "import jax.numpy as jnp, weakref\n"
        "seen = []\n"
        "def fail():\n"
        "    big = jnp.ones(4096)\n"
        "    seen.append(weakref.ref(big))\n"
        "    raise ValueError('boom')\n",
    )
    capsys.readouterr()
    result = shell.run_cell("%%tidy\nfail()\n")
    assert "raised ValueError: boom" in str(result.error_in_exec)
    assert "tidy: freed 1 jax array (16.0 KiB)" in capsys.readouterr().out
    big = shell.user_ns["seen"][0]()
    assert big is not None and big.is_deleted()  # the traceback's frame still refers to it


def test_a_raw_array_a_name_or_an_object_holds_is_kept(shell, capsys):
    run(shell, "import jax.numpy as jnp, numpy as np")
    capsys.readouterr()
    run(
        shell,
        """%%tidy
a = jnp.arange(3.0)
box = np.empty(1, dtype=object); box[0] = jnp.ones(2)
def make():
    k = jnp.ones(4)
    return lambda: k
get = make()
a, box, get
""",
    )
    assert "tidy: freed 0 buffers (0 B); kept 0" in capsys.readouterr().out
    ns = shell.user_ns
    assert not ns["a"].is_deleted() and not ns["box"][0].is_deleted()
    assert not ns["get"]().is_deleted()
    assert isinstance(ns["_"], tuple)  # nothing deleted: the output stays as shown


def test_never_deletes_an_array_something_outside_the_history_holds(shell):
    run(shell, "import jax.numpy as jnp, sys, types")
    run(
        shell,
        """%%tidy
mod = types.ModuleType("tidyjax_test_cache")
sys.modules[mod.__name__] = mod
mod.cache = jnp.ones(3)
del mod
class C:
    attr = jnp.ones(4)
sys.modules["tidyjax_test_cache"].cache, C.attr
""",
    )
    try:
        shown = shell.user_ns["_"]
        assert isinstance(shown, tuple) and not any(a.is_deleted() for a in shown)
    finally:
        import sys

        del sys.modules["tidyjax_test_cache"]


@pytest.mark.parametrize("mode", ["tidy", "auto"])
def test_a_jitted_function_from_the_cell_still_runs(shell, mode):
    run(shell, "import jax, jax.numpy as jnp")
    if mode == "auto":
        run(shell, "%tidyjax auto on")
    prefix = "%%tidy\n" if mode == "tidy" else ""
    run_numbered(
        shell,
        prefix + "def make():\n"
        "    k = jnp.arange(3.0)\n"
        "    return jax.jit(lambda x: x + k)\n"
        "f = make()\n"
        "g = jax.jit(lambda x: x * jnp.ones(3))\n"
        "f(1.0), g(2.0)\n",
    )
    assert freed_output(shell.user_ns["_"])
    result = run_numbered(shell, "f(1.0).tolist(), g(2.0).tolist()")
    assert result.result == ([1.0, 2.0, 3.0], [2.0, 2.0, 2.0])


def test_auto_mode_keeps_a_plain_jax_loop_flat(shell):
    run(shell, "import jax, jax.numpy as jnp")
    run(shell, "%tidyjax auto on")
    run_numbered(shell, "params = jnp.zeros(256)")
    counts = []
    for _ in range(5):
        run_numbered(shell, "params = params + 1.0\nparams, (params**2).sum()")
        counts.append(live_buffers())
    assert len(set(counts)) == 1, counts
    assert float(shell.user_ns["params"][0]) == 5.0
    run(shell, "%tidyjax auto off")


def test_without_the_extension_the_history_keeps_arrays_alive(shell):
    run(shell, "import jax, jax.numpy as jnp")
    run_numbered(shell, "params = jnp.zeros(256)")
    before = live_buffers()
    for _ in range(3):
        run_numbered(shell, "params = params + 1.0\nparams, (params**2).sum()")
    assert live_buffers() > before + 3  # what the extension frees, above


def test_timeline_magic_records_cells_and_shows_the_chart(shell, monkeypatch):
    from tidyjax.ipython import _loaded

    shown = []
    monkeypatch.setattr(shell.display_pub, "publish", lambda data, **kw: shown.append(data))
    bad = shell.run_cell("%tidyjax timeline show")
    assert "no timeline yet" in str(bad.error_in_exec)
    run_numbered(shell, "%tidyjax timeline on")
    try:
        first = shell.execution_count
        run_numbered(shell, "a = tj.tensor([1.0, 2.0])")
        run_numbered(shell, "%%tidy step\nb = a * 2\na + 1\n")
    finally:
        run_numbered(shell, "%tidyjax timeline off")
    tl = _loaded[id(shell)].hooks.last
    assert not tl.recording
    # one band per cell, named as its prompt; the %%tidy scope inside its cell's band
    bands = [e.scope for e in tl.events if e.kind == "scope_enter"]
    assert bands == [f"In[{first}]", f"In[{first + 1}]", "step", f"In[{first + 2}]"]
    # Tensors' buffers (JAX 0.6 also makes plain view objects over them, recorded untracked)
    allocs = [e for e in tl.events if e.kind == "alloc" and e.scope != "<untracked>"]
    tracked = {e.buffer for e in allocs}
    frees = [e for e in tl.events if e.kind == "free" and e.buffer in tracked]
    assert [e.bytes for e in allocs] == [8, 8, 8] and [e.scope for e in allocs] == [
        "",
        "step",
        "step",
    ]
    assert len(frees) == 1 and frees[0].buffer == allocs[2].buffer  # a + 1, only shown
    run(shell, "%tidyjax timeline")
    assert shown and "text/html" in shown[-1]
    assert f"In[{first}]" in shown[-1]["text/html"]
    html = shown[-1]["text/html"]
    from .test_timeline import page_data

    data = page_data(html)  # what the page's script draws: one band per cell
    assert 'class="tjtl"' in html and f"In[{first + 1}]" in data["strings"]
    assert "usage: %tidyjax" in str(shell.run_cell("%tidyjax timeline sometimes").error_in_exec)


def test_never_deletes_an_array_whose_buffer_a_kept_array_shares(shell, capsys):
    run(shell, "import jax, jax.numpy as jnp")
    capsys.readouterr()
    run(
        shell,
        "%%tidy\n"
        "pair = [jnp.arange(3.0)]\n"
        "view = jax.device_put(pair[0], jax.devices()[0])  # another object, the same buffer\n"
        "pair.pop()  # shown: only Out[] holds this object now\n",
    )
    assert "freed 0 buffers (0 B); kept 0" in capsys.readouterr().out
    assert shell.user_ns["view"].tolist() == [0.0, 1.0, 2.0]
    assert not shell.user_ns["_"].is_deleted()


def test_kept_tensors_and_variables_only_the_history_shows_are_not_freed(shell):
    run(shell, "%tidyjax auto on")
    run(shell, "tj.keep(tj.tensor([1.0])), tj.Variable([2.0], name='v')")
    kept, var = shell.user_ns["_"]
    run(shell, "%%tidy\nz = tj.tensor([3.0]) * 2\n")  # a %%tidy cell inside auto mode
    from tidyjax._context import CURRENT

    assert CURRENT.get() is None  # the inner cell's hooks did not replace auto mode's scope
    run(shell, "%tidyjax auto off")
    assert not kept.is_disposed and not var.is_disposed and not shell.user_ns["z"].is_disposed
    tj.dispose([kept, var])


# -- notebooks you can predict: what %%tidy frees, where its Tensors were made --------------------


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


# -- %%tidy frees what %%tidy cells showed, never an ordinary cell's output -----------------------


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


# -- a %%tidy cell's Tensors are named by that cell -----------------------------------------------


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


# -- a freed output says who freed it and how to keep it ------------------------------------------


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
