"""The IPython extension through IPython's InteractiveShell, and the rich displays."""

from __future__ import annotations

import gc
import weakref

import pytest

import tidyjax as tj

IPython = pytest.importorskip("IPython")
from IPython.core.interactiveshell import InteractiveShell  # noqa: E402


@pytest.fixture
def shell():
    sh = InteractiveShell.instance()
    sh.run_cell("%load_ext tidyjax", store_history=False)
    sh.run_cell("import tidyjax as tj", store_history=False)
    yield sh
    sh.run_cell("%tidyjax auto off", store_history=False)
    sh.reset(new_session=False)  # drop names and output history
    tj.dispose([v for v in list(sh.user_ns.values()) if isinstance(v, tj.Tensor)])
    gc.collect()


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
    run(shell, "t = tj.tensor([1.0, 2.0, 3.0])")
    info = run(shell, "%tidyjax memory").result
    assert isinstance(info, tj.MemoryInfo) and info.num_tensors == 1
    assert "tidyjax memory" in info._repr_html_() and "<table" in info._repr_html_()
    live = run(shell, "%tidyjax live").result
    assert isinstance(live, tj.Snapshot) and len(live.records) == 1
    assert "&lt;ipython-input" in live._repr_html_() or "<ipython-input" in str(live)


def test_rich_displays_never_raise_and_show_the_essentials():
    t = tj.tensor([[1.0, 2.0], [3.0, 4.0]])
    html = t._repr_html_()
    assert "float32[2,2]" in html and "16 B" in html and "cpu" in html.lower()
    assert "3. 4." in html
    v = tj.Variable([1.0], name="w")
    assert "Variable" in v._repr_html_() and "&#x27;w&#x27;" in v._repr_html_()
    p = tj.profile(lambda: t * 2)
    assert "<table" in p._repr_html_() and "mul" in p._repr_html_()
    with pytest.raises(tj.LeakError) as err, tj.check_leaks():
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
