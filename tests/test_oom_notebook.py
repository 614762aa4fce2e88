"""Out of memory where users meet it: the report as HTML in a notebook over a short traceback,
the function and line of a transformed call, the saved timeline page marking the failed
request, and a donating function that runs out.

As in ``test_oom_report.py``: on a CPU a 40 TB request fails at once when no earlier
computation is still running, so inputs are waited for first.
"""

from __future__ import annotations

import base64
import inspect
import json
import os
import pathlib
import re
import subprocess
import sys
import warnings

import jax.numpy as jnp
import numpy as np
import pytest

import tidyjax as tj
import tidyjax.numpy as tnp
from tidyjax import _oom
from tidyjax.__main__ import main as cli

HUGE = (10**13,)  # float32: 40 TB
HERE = os.path.relpath(__file__)
HERE = __file__ if HERE.startswith(os.pardir) else HERE


def line_of(marker: str) -> int:
    lines = inspect.getsource(inspect.getmodule(line_of)).splitlines()
    return next(i for i, text in enumerate(lines, 1) if marker in text and "line_of" not in text)


def huge_host(shape: tuple[int, ...] = HUGE) -> np.ndarray:
    return np.broadcast_to(np.float32(0), shape)


# -- OOMReport._repr_html_ ------------------------------------------------------------------------


def test_the_report_as_html_is_a_holders_table_with_bars():
    with tj.tidy("train"):
        big = tj.tensor(np.ones((256, 256), np.float32)).block_until_ready()  # HTML:big
        small = tj.tensor(np.ones(1, np.float32)).block_until_ready()
        raw = jnp.ones(1024).block_until_ready()  # 4 KiB, untracked
        with pytest.raises(tj.OutOfMemoryError) as info:
            small + huge_host()
        html = info.value.report._repr_html_()
        del raw, small, big
    assert html.startswith("<style>") and '<div class="tjx">' in html
    assert "Out of memory" in html and "could not allocate <b>36.4 TiB</b>" in html
    assert f"at {HERE}:{line_of('small + huge_host()')}" in html
    header = re.search(r"<table><tr>(.*?)</tr>", html).group(1)
    assert re.findall(r"<th[^>]*>([^<]*)</th>", header) == [
        "created at", "kind", "scope", "count", "bytes", "", "shapes"
    ]  # fmt: skip
    rows = re.findall(r"<tr><td.*?</tr>", html)
    assert len(rows) == 3  # big, small (tracked), raw (untracked)
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", r) for r in rows]
    assert cells[0][4] == "256.0 KiB" and cells[0][2] == "train" and cells[0][1] == "tensor"
    assert cells[0][0] == f"{HERE}:{line_of('HTML:big')} in {inspect.currentframe().f_code.co_name}"
    widths = [int(re.search(r"<div style=\"width:(\d+)px;", c[5]).group(1)) for c in cells]
    assert widths[0] == 120 and widths[1] == 0 and 0 < widths[2] < 5  # scaled to the largest
    assert "untracked" in cells[2][1] and cells[2][4] == "4.0 KiB"
    assert "<details><summary>JAX said</summary><pre>RESOURCE_EXHAUSTED" in html


def test_the_html_escapes_and_never_raises():
    site = tj.Site("<b>x.py</b>", 1, "f")
    holder = tj.SiteStat(site, "tensor", 1, 10, {"float32[1]": 1}, scope="s<1>")
    report = _oom.OOMReport(
        "f(<x>)", 8, 10, 0, 0, None, None, None, (holder,), (), (), "RESOURCE_EXHAUSTED & <y>"
    )
    html = report._repr_html_()
    assert "<b>x.py</b>" not in html and "&lt;b&gt;x.py&lt;/b&gt;" in html
    assert "f(&lt;x&gt;)" in html and "&amp; &lt;y&gt;" in html
    broken = _oom.OOMReport("f", 8, 0, 0, 0, None, None, None, ("not a holder",), (), (), "")  # type: ignore[arg-type]
    assert broken._repr_html_().startswith("<pre>")  # the plain text, not an exception


# -- the function and the line of a transformed call ----------------------------------------------


class Model:
    def step(self, s):
        return jnp.zeros(HUGE) + s

    def loss(self, s):
        return (jnp.zeros(HUGE) + s).sum()


def test_jit_grad_vmap_name_the_function_by_qualname_and_the_calling_line():
    model = Model()
    s = tj.tensor(1.0).block_until_ready()
    v = tj.tensor([1.0, 2.0]).block_until_ready()
    cases = [
        (lambda: tj.jit(model.step)(s), "Model.step(float32[])", "tj.jit(model.step)(s)"),
        (lambda: tj.grad(model.loss)(s), "Model.loss(float32[])", "tj.grad(model.loss)(s)"),
        (lambda: tj.vmap(model.step)(v), "Model.step(float32[2])", "tj.vmap(model.step)(v)"),
    ]
    for call, what, marker in cases:
        with pytest.raises(tj.OutOfMemoryError) as info:
            call()
        report = info.value.report
        assert report.what == what
        assert report.called_at == f"{HERE}:{line_of(marker)} in <lambda>"
        first = str(info.value).splitlines()[0]
        assert first.startswith(f"Out of memory: {what} could not allocate 36.4 TiB, called at ")
    tj.dispose([s, v])


def test_a_nested_function_keeps_its_locals_qualname_and_ops_name_their_line():
    def outer():
        def inner(s):
            return jnp.zeros(HUGE) + s

        return inner

    s = tj.tensor(1.0).block_until_ready()
    with pytest.raises(tj.OutOfMemoryError) as info:
        tj.jit(outer())(s)  # QUALNAME:nested
    name = "test_a_nested_function_keeps_its_locals_qualname_and_ops_name_their_line"
    assert info.value.report.what == f"{name}.<locals>.outer.<locals>.inner(float32[])"
    assert info.value.report.called_at == f"{HERE}:{line_of('QUALNAME:nested')} in {name}"
    with pytest.raises(tj.OutOfMemoryError) as info:
        tnp.zeros(HUGE)  # QUALNAME:op
    assert info.value.report.what == "zeros((10000000000000,))"
    assert info.value.report.called_at == f"{HERE}:{line_of('QUALNAME:op')} in {name}"
    with pytest.raises(tj.OutOfMemoryError) as info, tj.oom_report("block"):
        jnp.zeros(HUGE)  # QUALNAME:raw, inside the block: the error's own frame
    assert info.value.report.called_at == f"{HERE}:{line_of('QUALNAME:raw')} in {name}"
    s.dispose()


# -- the saved timeline page marks the failed request ---------------------------------------------


def test_the_saved_page_marks_the_request_and_what_was_alive_then(monkeypatch, tmp_path):
    monkeypatch.setenv("TIDYJAX_OOM_DIR", str(tmp_path))
    with tj.timeline() as tl:
        with tj.tidy("warmup"):  # an earlier, larger, unrelated peak: 1 MiB, all freed
            tj.tensor(np.ones((512, 512), np.float32)).block_until_ready()
        with tj.tidy("step"):
            x = tj.tensor(np.ones((64, 64), np.float32)).block_until_ready()  # 16 KiB
            with pytest.raises(tj.OutOfMemoryError) as info:
                x + huge_host((2_500_000_000, 64, 64))
    html_path, json_path = info.value.report.files
    page = pathlib.Path(html_path).read_text(encoding="utf-8")
    assert tl.peak_bytes == 1 << 20  # the warm-up
    (mark,) = tl.annotations  # the failed request, marked on the timeline itself
    assert mark.label.startswith("out of memory: add(float32[64,64], float32[2500000000,64,64])")
    assert mark.bytes == 4 * 2_500_000_000 * 64 * 64
    (made,) = [ev.time for ev in tl.events if ev.kind == "alloc" and ev.shape == (64, 64)]
    (exited,) = [ev.time for ev in tl.events if ev.kind == "scope_exit" and ev.scope == "step"]
    assert made <= mark.time <= exited  # the moment of the failure
    assert not any("out of memory" in ev.scope for ev in tl.events)  # no fake scope
    assert "tjx-oom" not in page  # no extra section: the page's own table, at the mark
    table = re.search(r'<table class="tj-peak-table"([^>]*)>(.*?)</table>', page, re.S)
    assert table is not None
    attrs = dict(re.findall(r'data-([\w-]+)="([^"]*)"', table.group(1)))
    assert attrs["mark-bytes"] == str(mark.bytes)
    assert attrs["alive"] == str(16 * 1024)  # what was alive at the failure, not the peak
    assert float(attrs["at"]) == mark.time
    body = table.group(2)
    caption = re.search(r"<caption>(.*?)</caption>", body, re.S).group(1)
    assert "Alive at \u201cout of memory: add(" in caption and "(37.3 TiB)" in caption
    assert ": 16.0 KiB in 1 buffer, largest first" in caption
    assert "(the peak, 1.0 MiB at +" in caption and "came earlier)" in caption
    assert re.search(r"<td[^>]*>step</td>", body)  # the holder's scope; the warm-up is not there
    assert "warmup" not in body
    charts = "".join(
        base64.b64decode(b).decode("utf-8")
        for b in re.findall(r"data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)", page)
    )
    lines = re.findall(r'<g class="tj-mark" data-label="([^"]*)"><line x1="([\d.]+)"', charts)
    assert [label for label, _ in lines] == [mark.label.replace(">", "&gt;")]  # a line, at...
    peak_x = float(re.search(r'<g class="tj-peak"><line x1="([\d.]+)"', charts).group(1))
    assert float(lines[0][1]) > peak_x  # ...its moment, after the warm-up's peak
    assert "37.3 TiB" in charts  # its label says the bytes asked for
    data = json.loads(pathlib.Path(json_path).read_text(encoding="utf-8"))
    assert data["oom"]["requested"] == mark.bytes
    assert data["oom"]["time"] == mark.time
    assert data["marks"] == [[mark.time, mark.label, mark.bytes]]
    loaded = tj.Timeline.load(json_path)
    assert loaded.peak_bytes == 1 << 20 and loaded.annotations == [mark]
    out = tmp_path / "viewed.html"
    assert cli(["view", json_path, "-o", str(out)]) == 0  # viewing the JSON marks it too
    viewed = out.read_text(encoding="utf-8")
    assert f'data-alive="{16 * 1024}"' in viewed and "Alive at \u201cout of memory" in viewed
    del data["marks"]  # a file saved before marks were kept: the "oom" key still marks it
    old = tmp_path / "old.json"
    old.write_text(json.dumps(data), encoding="utf-8")
    assert tj.Timeline.load(old).annotations == []
    assert cli(["view", str(old), "-o", str(tmp_path / "old.html")]) == 0
    assert f'data-alive="{16 * 1024}"' in (tmp_path / "old.html").read_text(encoding="utf-8")
    x.dispose()


# -- donation --------------------------------------------------------------------------------------


def test_a_donating_function_that_runs_out():
    """JAX deletes a donated buffer when the call starts, even when the call then runs out of
    memory (raw JAX too): the input is gone, and tidyjax says so instead of counting a deleted
    buffer or calling it "deleted outside tidyjax"."""

    def step(x):
        return jnp.zeros(HUGE) + x.sum(), x * 2

    x = tj.tensor(np.ones(256, np.float32)).block_until_ready()
    alias = x.clone()  # the same buffer
    other = tj.tensor(np.ones(8, np.float32)).block_until_ready()
    before = tj.memory()
    assert (before.num_tensors, before.num_bytes) == (3, 1024 + 32)
    f = tj.jit(step, donate_argnums=0)
    raw = x.array
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a donation XLA could not use: JAX warns
        with pytest.raises(tj.OutOfMemoryError) as info:
            f(x)
    report = info.value.report
    assert report.what == f"{step.__qualname__}(float32[256])"
    if not raw.is_deleted():  # older JAX (0.6) keeps the input of a call that failed
        assert report.donated == () and not x.is_disposed and not alias.is_disposed
        assert [h.bytes for h in report.holders if h.tracked] == [1024, 32]
        tj.dispose([x, alias, other])
        assert tj.memory().num_tensors == 0
        return
    assert report.donated == ("float32[256] (1.0 KiB)",)
    assert "Donated and consumed although the call failed" in str(info.value)
    assert "Donated and consumed" in report._repr_html_()
    # the report counts what is alive: not the consumed input
    assert [(h.bytes, h.count) for h in report.holders if h.tracked] == [(32, 1)]
    assert report.tracked_bytes == 32
    for t in (x, alias):  # every Tensor on the buffer names the function
        assert t.is_disposed
        with pytest.raises(tj.DisposedError, match=r"donated to jit-compiled function .*step"):
            t + 1
    after = tj.memory()
    assert (after.num_tensors, after.num_bytes) == (1, 32)
    y = tj.tensor(np.ones(256, np.float32)).block_until_ready()
    z, w = tj.jit(lambda a: (a + 1, a * 0), donate_argnums=0)(y)  # a donation that runs
    assert y.is_disposed and float(z.sum()) == 512.0
    tj.dispose([z, w, other])
    assert tj.memory().num_tensors == 0


# -- a real kernel -----------------------------------------------------------------------------


def test_in_a_notebook_the_report_shows_as_html_over_a_short_traceback():
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    new = nbformat.v4.new_code_cell
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        new("%load_ext tidyjax\nimport numpy as np\nimport tidyjax as tj\nimport jax.numpy as jnp"),
        new(
            "class Model:\n"
            "    def step(self, s):\n"
            "        return jnp.zeros((10**13,)) + s\n"
            "\n"
            "kept = tj.tensor(np.ones((256, 256), np.float32)).block_until_ready()\n"
            "s = tj.tensor(1.0).block_until_ready()\n"
            "y = tj.jit(Model().step)(s)"
        ),
        new("def make(n):\n    return tj.numpy.zeros((n,))\n\nz = make(10**13)"),
        new("print(tj.memory().num_tensors, tj.memory().num_bytes)"),
    ]
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3", allow_errors=True)
    client.execute()
    ansi = re.compile(r"\x1b\[[0-9;]*m")
    for cell, call in ((nb.cells[1], "y = tj.jit(Model().step)(s)"), (nb.cells[2], "make(")):
        kinds = [o.output_type for o in cell.outputs]
        assert kinds == ["display_data", "error"], kinds  # the report first, then the error
        html = cell.outputs[0].data["text/html"]
        assert "Out of memory" in html and re.search(r"<th[^>]*>created at</th>", html)
        error = cell.outputs[1]
        assert error.ename == "OutOfMemoryError"
        text = ansi.sub("", "\n".join(error.traceback))
        assert call in text  # the user's line is kept
        assert "jax/_src" not in text and "/tidyjax/" not in text and "site-packages" not in text
        assert "JaxRuntimeError" not in text  # JAX's chained error is not shown
        assert "The report is above" in text
        assert len(text.splitlines()) < 25, text
    first = cell_html = nb.cells[1].outputs[0].data["text/html"]
    assert "Model.step(float32[])" in first and "In[2], line 7" in cell_html
    assert "256.0 KiB" in cell_html and "In[2], line 5" in cell_html  # the holder `kept`
    inner = ansi.sub("", "\n".join(nb.cells[2].outputs[1].traceback))
    assert "return tj.numpy.zeros((n,))" in inner  # the user's function frame is kept too
    printed = "".join(o.get("text", "") for o in nb.cells[3].outputs)
    assert printed.split() == ["2", str(256 * 256 * 4 + 4)]  # the counts are right afterwards


_IN_IPYTHON = r"""
import re, sys
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output
import tidyjax as tj

sh = InteractiveShell.instance()
sh.run_cell("%load_ext tidyjax", store_history=False)
assert sh.custom_exceptions == (tj.OutOfMemoryError,)
with capture_output() as cap:
    result = sh.run_cell("import tidyjax.numpy as tnp\nz = tnp.zeros((10**13,))")
assert isinstance(result.error_in_exec, tj.OutOfMemoryError)
(shown,) = cap.outputs  # the report, as HTML and text
assert "text/html" in shown.data and "could not allocate" in shown.data["text/html"]
text = re.sub(r"\x1b\[[0-9;]*m", "", cap.stdout)
assert "z = tnp.zeros((10**13,))" in text and "The report is above" in text, text
assert "/tidyjax/" not in text and "jax/_src" not in text, text
assert sys.last_value is result.error_in_exec  # %tb and %debug see the whole error
sh.run_cell("%unload_ext tidyjax", store_history=False)
assert sh.custom_exceptions == ()
mine = (ZeroDivisionError,)
sh.set_custom_exc(mine, lambda *a, **k: None)  # the user's own handler stays
sh.run_cell("%load_ext tidyjax", store_history=False)
assert sh.custom_exceptions == mine
print("OK")
"""


def test_in_ipython_the_handler_comes_and_goes_with_the_extension():
    """In its own process: JAX keeps the failed call's operands alive (in C++, out of reach),
    which would show as untracked strays to the tests after this one."""
    pytest.importorskip("IPython")
    done = subprocess.run(
        [sys.executable, "-c", _IN_IPYTHON], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("OK"), done.stderr[-3000:]
