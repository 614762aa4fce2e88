"""The rich displays as a reader sees them.

Every ``_repr_html_`` is rendered in many states (``DISPLAYS``) and checked twice: as text here
(units, counted nouns, cell names, what each display must show) and in headless Chromium, in
one page per theme (light, dark by ``prefers-color-scheme``, and JupyterLab's dark and light
CSS variables on a wrapper): no console errors, text contrast of at least 4.5:1, numbers on
one line, bars that suit the page, a screenshot that is not blank.

Chromium is driven over its DevTools protocol on a pipe (``--remote-debugging-pipe``), so
nothing but Debian's ``chromium`` is needed: no driver, no Python package.
"""

from __future__ import annotations

import base64
import contextlib
import gc
import html
import io
import json
import os
import pathlib
import re
import select
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tidyjax as tj
import tidyjax.random as tjr
from tidyjax._census import Site, TensorRecordList
from tidyjax._snapshot import SiteDiffList

from .conftest import chromium
from .headless import COLOUR_JS

# -- the states ----------------------------------------------------------------------------------


class _FakeDevice:
    """A second accelerator for a MemoryInfo built by hand (device totals exist on GPUs only)."""

    def __str__(self) -> str:
        return "cuda:1"


def _loop(x: tj.Tensor) -> tj.Tensor:
    for _ in range(3000):
        y = x * 2.0
    return y


def _local_states() -> dict[str, tuple[str, str]]:
    """Display name -> (HTML, text) of every display in every state one device allows."""
    out: dict[str, tuple[str, str]] = {}

    def show(name: str, obj: Any) -> None:
        out[name] = (obj._repr_html_(), str(obj))

    with tj.tidy("train") as scope:
        big = tj.tensor(np.arange(2**20, dtype=np.float32).reshape(1024, 1024))  # 4.0 MiB
        show("Tensor, live in a scope", big)
        show("Scope, open", scope)
    show("Tensor, disposed", big)
    show("Scope, exited", scope)
    show("Scope, not entered", tj.tidy("later"))
    key = tjr.key(0)
    show("Tensor, PRNG key", key)
    v = tj.Variable([1.0, 2.0], name="w")
    show("Variable", v)
    kept = tj.keep(tj.tensor([1, 2, 3]))
    show("Tensor, kept", kept)
    show("memory(), with tensors", tj.memory())
    raw = jnp.ones((256, 256))  # a jax array tidyjax does not own
    show("memory(), with untracked arrays", tj.memory())
    del raw
    dev, other = jax.devices()[0], _FakeDevice()
    gpu = tj.MemoryInfo(
        num_tensors=4, num_data_buffers=2, num_bytes=4 << 20, unreliable=False, reasons=(),
        bytes_per_device={dev: 3 << 20, other: 1 << 20},
        untracked_arrays=0, untracked_bytes=0,
        device_stats={dev: {"bytes_in_use": 6 << 30, "bytes_limit": 16 << 30},
                      other: {"bytes_in_use": 8 << 30, "bytes_limit": 16 << 30}},
    )  # fmt: skip
    show("memory(), device totals", gpu)

    before = tj.snapshot()
    grown = [tj.tensor([1.0, 2.0]) * 2 for _ in range(3)]
    one = tj.tensor([5.0])
    show("Snapshot", tj.snapshot())
    show("compare_to list", tj.snapshot().compare_to(before))
    show("compare_to list, no change", before.compare_to(before))
    show("TensorRecord list", tj.live_tensors())
    show("Snapshot, empty", tj.Snapshot([]))

    small = tj.profile(lambda: tj.tensor([1.0, 2.0, 3.0]).square())
    show("ProfileInfo, small", small)
    looped = tj.profile(_loop, one)
    show("ProfileInfo, 3000-op loop", looped)

    with tj.check_leaks() as checker:
        pass
    show("LeakReport, empty", checker.report)
    with pytest.raises(tj.LeakError) as err, tj.check_leaks(count_locals=True):
        leaked = tj.tensor([1.0, 2.0, 3.0])
    show("LeakReport, one leak", err.value.report)

    tj.dispose([big, key, v, kept, grown, one, small.result, looped.result, leaked])
    gc.collect()
    show("memory(), nothing alive", tj.memory(scan_untracked=False))
    return out


# Run with 8 virtual CPU devices: the flag must be set before JAX starts (a subprocess).
_MESH_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import tidyjax as tj

    mesh = Mesh(np.array(jax.devices()), ("x",))
    sharded = tj.tensor(np.arange(64, dtype=np.float32), device=NamedSharding(mesh, P("x")))
    replicated = sharded.to(NamedSharding(mesh, P()))
    out = {
        "Tensor, sharded": [sharded._repr_html_(), str(sharded)],
        "Tensor, replicated": [replicated._repr_html_(), str(replicated)],
        "memory(), 8 devices": [tj.memory(scan_untracked=False)._repr_html_(),
                                str(tj.memory(scan_untracked=False))],
    }
    tj.dispose([sharded, replicated])
    with open(sys.argv[1], "w") as f:
        json.dump(out, f)
    """
)


def _mesh_states(tmp: pathlib.Path) -> dict[str, tuple[str, str]]:
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
    env.pop("JAX_PLATFORMS", None)
    path = tmp / "mesh.json"
    proc = subprocess.run(
        [sys.executable, "-c", _MESH_SCRIPT, str(path)],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {k: (v[0], v[1]) for k, v in json.loads(path.read_text()).items()}


@pytest.fixture(scope="module")
def displays(tmp_path_factory) -> dict[str, tuple[str, str]]:
    states = _local_states()
    states.update(_mesh_states(tmp_path_factory.mktemp("mesh")))
    return states


def _text_of(markup: str) -> str:
    """The visible text of a display (the style sheet and tags dropped)."""
    markup = re.sub(r"<style>.*?</style>", "", markup, flags=re.S)
    return html.unescape(re.sub(r"<[^>]+>", " ", markup))


def _rows(markup: str) -> list[list[str]]:
    rows = [re.findall(r"<td[^>]*>(.*?)</td>", r) for r in re.findall(r"<tr>(.*?)</tr>", markup)]
    return [r for r in rows if r]


def _bar(cell: str) -> int | None:
    found = re.search(r'<div style="width:(\d+)px;[^"]*"></div>', cell)
    return int(found.group(1)) if found else None


# -- what each display says ----------------------------------------------------------------------


def test_every_display_in_every_state_renders(displays):
    assert len(displays) >= 24
    for name, (markup, _) in displays.items():
        assert markup.startswith("<style>") and '<div class="tjx">' in markup, name
        assert "<pre>" not in markup[:30], name  # not the never-raises fallback


def test_no_count_reads_one_tensors(displays):
    plural = re.compile(
        r"\b1 (tensors|buffers|ops|kernels|jax arrays|devices|sites|live tensors)\b|\(s\)"
    )
    for name, (markup, text) in displays.items():
        for shown in (_text_of(markup), text):
            assert not plural.search(shown), (name, plural.search(shown))
    assert "1 tensor," in displays["LeakReport, one leak"][1]
    assert "1 op of 1 kernel" in displays["ProfileInfo, small"][1]


def test_bytes_read_alike_everywhere(displays):
    tensor_html, _ = displays["Tensor, live in a scope"]
    assert "4.0 MiB" in _text_of(tensor_html) and "4194304" not in tensor_html
    with tj.tidy():
        t = tj.tensor(np.zeros(2**20, np.float32))
        info = tj.profile(lambda: t * 2)
        (record,) = [r for r in tj.live_tensors() if r.id == t.id]
        assert "4.0 MiB" in repr(record)
    for shown in (info._repr_html_(), str(info)):
        assert "+4.0 MiB" in shown and "4194304" not in shown
    assert "(12 B)" in repr(_exited_scope())


def _exited_scope() -> tj.Scope:
    with tj.tidy("s") as scope:
        t = tj.tensor([1.0, 2.0, 3.0])  # freed by the scope: 12 B
    assert t.is_disposed
    return scope


def test_numbers_are_right_aligned_tabular_and_never_wrap():
    from tidyjax import _html

    assert ".tjx .n{text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums}" in (
        _html.STYLE
    )
    table = _html.table(["what", "bytes"], [("a", "16.0 MiB")], numeric={1})
    assert '<td class="n" style="text-align:right">16.0 MiB</td>' in table
    assert '<td style="text-align:left">a</td>' in table  # inline: survives a sanitizer


def test_sites_name_cells_like_ipython_and_files_relative_to_the_working_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    inside = Site(str(tmp_path / "pkg" / "model.py"), 12, "step")
    assert str(inside) == f"{os.path.join('pkg', 'model.py')}:12 in step"
    outside = Site(os.path.abspath(os.sep + os.path.join("opt", "lib", "x.py")), 3, "f")
    assert str(outside) == f"{outside.file}:3 in f"
    assert str(Site("<stdin>", 1, "<module>")) == "<stdin>:1 in <module>"


def test_sites_in_an_ipython_cell_read_like_its_tracebacks():
    pytest.importorskip("IPython")
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_cell("import tidyjax as tj", store_history=False)
    cell = shell.execution_count
    shell.run_cell("def make():\n    return tj.tensor([1.0])\nt = make()", store_history=True)
    try:
        (record,) = tj.live_tensors()
        assert str(record.site) == f"In[{cell}], line 2 in make"
    finally:
        shell.user_ns.pop("t").dispose()


def test_memory_with_nothing_alive_says_so(displays):
    markup, _ = displays["memory(), nothing alive"]
    assert "nothing tracked" in markup and "<table" not in markup


def test_memory_bars_have_one_scale_per_column(displays):
    markup, _ = displays["memory(), device totals"]
    header = re.findall(r"<th[^>]*>(.*?)</th>", markup)
    assert header == ["device", "tidyjax bytes", "", "in use (all of JAX)", "limit", ""]
    rows = _rows(markup)
    assert [_bar(r[2]) for r in rows] == [120, 40]  # tidyjax bytes, against the largest: 3:1
    assert [_bar(r[5]) for r in rows] == [45, 60]  # JAX in use against the limit: 6/16, 8/16


def test_memory_untracked_arrays_have_their_own_row(displays):
    markup, text = displays["memory(), with untracked arrays"]
    (row,) = [r for r in _rows(markup) if "untracked" in r[0]]
    assert "1 jax array" in row[0] and row[1] == "256.0 KiB" and _bar(row[2]) is not None
    assert "untracked: 1 jax array not owned by tidyjax, 256.0 KiB" in text


def test_sharded_and_replicated_tensors_show_spec_mesh_and_bytes_per_device(displays):
    sharded = _text_of(displays["Tensor, sharded"][0])
    replicated = _text_of(displays["Tensor, replicated"][0])
    assert "sharded P('x') over mesh x=8 · 32 B per device on 8 devices" in sharded
    assert "replicated over mesh x=8 · 256 B per device on 8 devices" in replicated
    assert len(_rows(displays["memory(), 8 devices"][0])) == 8


def test_prng_key_tensor_repr_display_and_site():
    key = tjr.key(0)
    try:
        # JAX prints "Array((), dtype=key<fry>) overlaying:\n[0 0]"; it once lost its end
        assert repr(key).startswith("Tensor((), dtype=key<fry>)") and repr(key).endswith("[0 0]")
        shown = _text_of(key._repr_html_())
        assert "key<fry>[] · 8 B" in shown and "key data" in shown and "[0 0]" in shown
        (record,) = tj.live_tensors()
        assert (
            record.site is not None
            and record.site.function == "test_prng_key_tensor_repr_display_and_site"
        )
    finally:
        key.dispose()


def test_profile_of_a_long_loop_is_a_summary_with_the_log_folded(displays):
    markup, text = displays["ProfileInfo, 3000-op loop"]
    assert len(markup) < 100_000, len(markup)
    summary, log = markup.split("<details>")
    assert "first call (compile)" in summary
    (row,) = _rows(summary)
    assert row[0] == "mul" and row[1] == "3000"
    assert "3000 ops; the first and last 50 shown" in log
    assert len(_rows(log)) == 101  # 50, the gap, 50
    assert "2900 ops not shown" in log and "2900 ops not shown" in text
    assert "first call (compile)" in text and len(text.splitlines()) < 110


def test_leak_reports_are_calm_when_empty_and_hide_tidyjax_frames(displays):
    markup, text = displays["LeakReport, empty"]
    assert "no leaks" in markup and "leak:" not in markup and 'class="r"' not in markup
    assert text.startswith("no leaks")
    assert 'class="r"' in displays["LeakReport, one leak"][0]

    def leaky():
        with tj.check_leaks():
            return tj.tensor([1.0])

    with pytest.raises(tj.LeakError) as err:
        leaky()
    tb = err.value.__traceback__
    ours = os.path.dirname(tj.__file__)
    frames = []
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.startswith(ours):
            frames.append(tb.tb_frame)
        tb = tb.tb_next
    assert frames and all(f.f_locals.get("__tracebackhide__") for f in frames)


def test_ipython_shows_one_tidyjax_frame_of_an_uncaught_leak_error(capsys):
    pytest.importorskip("IPython")
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_cell("import tidyjax as tj", store_history=False)
    capsys.readouterr()
    shell.run_cell("@tj.check_leaks()\ndef f():\n    global z\n    z = tj.tensor([1.0])\nf()")
    shown = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out)
    shell.user_ns.pop("z").dispose()
    assert "LeakError" in shown and "raise_leaks" not in shown and "def check" not in shown
    assert shown.count(os.path.join("tidyjax", "_leaks.py")) == 1  # the innermost frame


def test_scope_and_diff_list_have_rich_displays(displays):
    assert "buffers created" in displays["Scope, exited"][0]
    assert "exited" in _text_of(displays["Scope, exited"][0])
    assert "not entered yet" in displays["Scope, not entered"][0]
    diffs = _rows(displays["compare_to list"][0])
    assert diffs[0][1:] == ["3", "+3", "24 B", "+24 B"]
    before = tj.snapshot()
    assert isinstance(before.compare_to(before), SiteDiffList)
    assert isinstance(before.compare_to(before), list)
    assert isinstance(tj.live_tensors(), TensorRecordList)
    assert "no change" in displays["compare_to list, no change"][0]


# -- in a real browser ---------------------------------------------------------------------------


def _above(fd: int, lowest: int) -> int:
    """A copy of ``fd`` numbered ``lowest`` or more; ``fd`` is closed."""
    import fcntl

    copy = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, lowest)
    os.close(fd)
    return copy


class _Chromium:
    """Headless Chromium, driven over the DevTools protocol on a pipe (fds 3 and 4)."""

    def __init__(self, exe: str, profile: str) -> None:
        cmd_r, self._cmd = os.pipe()
        self._out, out_w = os.pipe()
        # The child's ends, numbered above 3 and 4 so that moving them there cannot clash.
        cmd_r, out_w = (_above(fd, 10) for fd in (cmd_r, out_w))
        args = ["--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
                f"--user-data-dir={profile}", "--no-first-run", "--hide-scrollbars",
                "--window-size=900,700", "about:blank"]  # fmt: skip
        # A Python trampoline moves the pipe ends to fds 3 and 4, where Chromium expects them.
        trampoline = (
            "import os, sys; os.dup2(int(sys.argv[1]), 3); os.dup2(int(sys.argv[2]), 4); "
            "os.execv(sys.argv[3], sys.argv[3:])"
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-c", trampoline, str(cmd_r), str(out_w), exe, *args],
            pass_fds=(cmd_r, out_w), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        os.close(cmd_r)
        os.close(out_w)
        self._buf = b""
        self._id = 0
        self.events: list[dict[str, Any]] = []
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)[
            "sessionId"
        ]
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable", session=self.session)

    def _message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._out], [], [], left)[0]:
                raise TimeoutError("chromium did not answer")
            chunk = os.read(self._out, 1 << 20)
            if not chunk:
                raise EOFError("chromium exited")
            self._buf += chunk
        message, self._buf = self._buf.split(b"\0", 1)
        return json.loads(message)  # type: ignore[no-any-return]

    def call(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        self._id += 1
        request: dict[str, Any] = {"id": self._id, "method": method, "params": params}
        if session:
            request["sessionId"] = session
        os.write(self._cmd, json.dumps(request).encode() + b"\0")
        deadline = time.monotonic() + 120
        while True:
            message = self._message(deadline)
            if message.get("id") == self._id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})  # type: ignore[no-any-return]
            self.events.append(message)

    def page(self, method: str, **params: Any) -> dict[str, Any]:
        return self.call(method, session=self.session, **params)

    def open(self, url: str, scheme: str) -> list[str]:
        """Load ``url`` with ``prefers-color-scheme: scheme``; the console's errors."""
        self.page("Emulation.setEmulatedMedia",
                  features=[{"name": "prefers-color-scheme", "value": scheme}])  # fmt: skip
        self.events = []
        self.page("Page.navigate", url=url)
        deadline = time.monotonic() + 120
        while not any(e.get("method") == "Page.loadEventFired" for e in self.events):
            self.events.append(self._message(deadline))
        errors = []
        for e in self.events:
            method, p = e.get("method"), e.get("params", {})
            if method == "Runtime.exceptionThrown":
                errors.append(str(p.get("exceptionDetails")))
            elif method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                errors.append(str(p.get("args")))
            elif method == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                errors.append(str(p["entry"].get("text")))
        return errors

    def evaluate(self, expression: str) -> Any:
        got = self.page("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in got:
            raise RuntimeError(str(got["exceptionDetails"]))
        return got["result"].get("value")

    def close(self) -> None:
        with contextlib.suppress(EOFError, TimeoutError, RuntimeError, OSError):
            self.call("Browser.close")
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._cmd)
        os.close(self._out)


@pytest.fixture(scope="module")
def browser() -> Iterator[_Chromium]:
    exe = chromium()
    with tempfile.TemporaryDirectory() as profile:
        page = _Chromium(exe, profile)
        try:
            yield page
        finally:
            page.close()


# JupyterLab's own values (packages/theme-*-extension/style/variables.css) of the variables
# the displays read.
JUPYTERLAB_DARK = {
    "--jp-content-font-color0": "rgba(255, 255, 255, 1)",
    "--jp-content-font-color1": "rgba(255, 255, 255, 1)",
    "--jp-content-font-color2": "rgba(255, 255, 255, 0.7)",
    "--jp-layout-color0": "#111",
    "--jp-layout-color2": "#424242",
    "--jp-border-color2": "#424242",
    "--jp-brand-color1": "#2196f3",
    "--jp-error-color1": "#f44336",
    "--jp-ui-font-color1": "rgba(255, 255, 255, 0.87)",
    "--jp-rendermime-table-row-background": "#212121",
}
JUPYTERLAB_LIGHT = {
    "--jp-content-font-color0": "rgba(0, 0, 0, 1)",
    "--jp-content-font-color1": "rgba(0, 0, 0, 0.87)",
    "--jp-content-font-color2": "rgba(0, 0, 0, 0.54)",
    "--jp-layout-color0": "white",
    "--jp-layout-color2": "#eee",
    "--jp-border-color2": "#e0e0e0",
    "--jp-brand-color1": "#1976d2",
    "--jp-error-color1": "#d32f2f",
    "--jp-ui-font-color1": "rgba(0, 0, 0, 0.87)",
    "--jp-rendermime-table-row-background": "#f5f5f5",
}
# theme -> (prefers-color-scheme, the JupyterLab variables on a wrapper, or None)
THEMES = {
    "light": ("light", None),
    "dark": ("dark", None),
    "jupyterlab-dark": ("light", JUPYTERLAB_DARK),
    "jupyterlab-light-on-a-dark-system": ("dark", JUPYTERLAB_LIGHT),
}

# The page: a narrow pane, like a notebook's output beside a sidebar. In the JupyterLab themes
# the pane is an output area with JupyterLab's own table rules (rendermime's base.css): fixed
# layout, centred, striped rows, cells that wrap.
_PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>tidyjax displays</title>
<style>body{{margin:8px;background:#fff;color:#000;font:14px sans-serif}}
@media (prefers-color-scheme:dark){{body{{background:#111;color:#e0e0e0}}}}
h3{{font-size:12px;margin:10px 0 2px}} .pane{{width:380px}}
.jp-RenderedHTMLCommon table{{border-collapse:collapse;border:none;table-layout:fixed;
  color:var(--jp-ui-font-color1);margin-left:auto;margin-right:auto;margin-bottom:1em}}
.jp-RenderedHTMLCommon td,.jp-RenderedHTMLCommon th,.jp-RenderedHTMLCommon tr{{
  vertical-align:middle;padding:.5em;line-height:normal;white-space:normal;border:none;
  text-align:right}}
.jp-RenderedHTMLCommon tbody tr:nth-child(odd){{background:var(--jp-layout-color0)}}
.jp-RenderedHTMLCommon tbody tr:nth-child(even){{
  background:var(--jp-rendermime-table-row-background)}}
</style></head>
<body><div class="{pane}" style="{wrapper}">{sections}</div></body></html>"""


def _page(displays: dict[str, tuple[str, str]], variables: dict[str, str] | None) -> str:
    pane, wrapper = "pane", ""
    if variables:
        pane += " jp-RenderedHTMLCommon"
        wrapper = "".join(f"{k}:{v};" for k, v in variables.items())
        wrapper += "background:var(--jp-layout-color0);color:var(--jp-content-font-color0);"
        wrapper += "padding:4px"
    sections = "".join(
        f'<section data-state="{html.escape(name)}"><h3>{html.escape(name)}</h3>{markup}</section>'
        for name, (markup, _) in displays.items()
    )
    return _PAGE.format(pane=pane, wrapper=wrapper, sections=sections)


# Measures the page as rendered: colours are read back through a canvas, so any CSS colour
# syntax (color-mix included) resolves to the pixels a reader sees.
_MEASURE = (
    "(() => {\n"
    + COLOUR_JS
    + """
  document.querySelectorAll('details').forEach(d => { d.open = true; });
  const out = {texts: 0, numbers: 0, bars: 0,
               lowContrast: [], wrapped: [], misaligned: [], badBars: []};
  for (const box of document.querySelectorAll('.tjx')) {
    const state = box.closest('[data-state]').dataset.state;
    for (const el of [box, ...box.querySelectorAll('*')]) {
      const text = ownText(el);
      if (!text || !el.getClientRects().length) continue;
      const bg = behind(el), fg = over(rgba(getComputedStyle(el).color), bg);
      const ratio = contrast(fg, bg);
      out.texts++;
      if (ratio < 4.5) out.lowContrast.push({state, text: text.slice(0, 40), ratio, fg, bg});
    }
    for (const cell of box.querySelectorAll('td.n')) {
      if (!cell.textContent.trim()) continue;
      out.numbers++;
      const range = document.createRange();
      range.selectNodeContents(cell);
      const lines = new Set([...range.getClientRects()].map(r => Math.round(r.top))).size;
      const style = getComputedStyle(cell);
      const height = range.getBoundingClientRect().height;
      if (lines !== 1 || height > 1.5 * parseFloat(style.lineHeight))
        out.wrapped.push({state, text: cell.textContent, lines});
      if (style.textAlign !== 'right' || !style.fontVariantNumeric.includes('tabular-nums'))
        out.misaligned.push({state, text: cell.textContent});
    }
    for (const bar of box.querySelectorAll('.bar')) {
      out.bars++;
      const page = behind(bar.parentElement);
      const track = over(rgba(getComputedStyle(bar).backgroundColor), page);
      const fill = bar.firstElementChild;
      const ink = over(rgba(getComputedStyle(fill).backgroundColor), track);
      // a track is a faint strip of its page (not a white strip on a dark one); the fill shows
      const filled = fill.getBoundingClientRect().width > 0;
      if (contrast(track, page) > 2.5 || (filled && contrast(ink, track) < 3))
        out.badBars.push({state, track, page, ink});
    }
  }
  return out;
})()"""
)


@pytest.fixture(scope="module")
def pages(displays, tmp_path_factory) -> dict[str, pathlib.Path]:
    where = tmp_path_factory.mktemp("pages")
    out = {}
    for theme, (_, variables) in THEMES.items():
        out[theme] = where / f"{theme}.html"
        out[theme].write_text(_page(displays, variables), encoding="utf-8")
    return out


@pytest.mark.parametrize("theme", list(THEMES))
def test_displays_read_well_in_the_browser(browser, pages, theme):
    scheme, _ = THEMES[theme]
    errors = browser.open(pages[theme].as_uri(), scheme)
    assert errors == []
    assert browser.evaluate("matchMedia('(prefers-color-scheme: dark)').matches") == (
        scheme == "dark"
    )
    got = browser.evaluate(_MEASURE)
    assert got["texts"] > 200 and got["numbers"] > 100 and got["bars"] >= 10, got
    assert got["lowContrast"] == [], got["lowContrast"][:5]
    assert got["wrapped"] == [], got["wrapped"][:5]
    assert got["misaligned"] == [], got["misaligned"][:5]
    assert got["badBars"] == [], got["badBars"][:5]


def test_a_screenshot_of_the_dark_page_is_not_blank(browser, pages):
    image = pytest.importorskip("PIL.Image")
    assert browser.open(pages["dark"].as_uri(), "dark") == []
    png = base64.b64decode(browser.page("Page.captureScreenshot", format="png")["data"])
    pixels = image.open(io.BytesIO(png)).convert("RGB")
    colours = pixels.getcolors(maxcolors=1 << 20) or []
    background = max(colours)[1] if colours else None
    assert background == (17, 17, 17)  # the dark page, not a white one
    ink = sum(n for n, c in colours if c != background)
    assert len(colours) > 20 and ink > 0.02 * pixels.width * pixels.height
