"""The displays in a real JupyterLab 4, trusted and untrusted, in its light and dark themes.

One JupyterLab server (127.0.0.1, a free port, a fixed token, its own settings, data and
workspace folders) and one headless Chromium serve the whole module. A notebook showing every
kind of display (``memory()``, a Tensor, a tidy scope, ``live_tensors()``, a leak report,
``profile()``, a timeline) is executed with nbclient first, so its outputs exist, then saved
twice: signed with the server's own notary (trusted: scripts run) and as a changed, unsigned copy
(untrusted: JupyterLab's sanitizer drops ``<style>``, ``<script>`` and ``<svg>``). Each is opened
in JupyterLab Light under a dark OS and JupyterLab Dark under a light OS (each theme against the
system's scheme, so that only the theme can make it right), and read from the DOM (untrusted,
alignment and bars are expected failures until the markup carries inline styles):

- text contrast of at least 4.5:1 against the background composed from the element's ancestors;
- text columns (and their headers) aligned left, number columns right;
- bars with a height and a fill that stands out of their track;
- the timeline's chart: the live SVG with its areas where scripts run, else the ``<img>`` of the
  static chart, with no text of the chart spilled into the page;
- no SEVERE message in the browser's console.

The same outputs are also shown on a plain white page under a dark OS (a classic Notebook or an
HTML export): readable too. ``tests/test_displays_hosts.py`` covers that host with every display
state built in-process; here it is the notebook's real outputs.

Needs the ``jupyterlab`` package (the ``test`` extra), Debian's ``chromium`` and
``chromium-driver``; skipped with the reason where they are absent, failed in CI.
"""

from __future__ import annotations

import base64
import copy
import html
import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from .headless import COLOUR_JS, headless_chromium

selenium = pytest.importorskip("selenium", reason="pip install selenium (the test extra)")
nbformat = pytest.importorskip("nbformat", reason="pip install nbformat (the test extra)")
nbclient = pytest.importorskip("nbclient", reason="pip install nbclient (the test extra)")
pytest.importorskip("ipykernel", reason="pip install ipykernel (the test extra)")
pytest.importorskip("jupyterlab", reason="pip install 'jupyterlab>=4' (the test extra)")

from nbformat.sign import NotebookNotary  # noqa: E402
from selenium.common.exceptions import TimeoutException  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

TOKEN = "tidyjax-test-token"
THEMES = {"light": "JupyterLab Light", "dark": "JupyterLab Dark"}
# Each theme under the opposite system scheme: the theme alone must decide.
SYSTEM = {"light": "dark", "dark": "light"}
VIEWS = [(trust, theme) for trust in ("trusted", "untrusted") for theme in THEMES]

# -- the notebook ---------------------------------------------------------------------------------

# (display name or None, source): one code cell each, in order.
CELLS: list[tuple[str | None, str]] = [
    (None, "import numpy as np\nimport tidyjax as tj"),
    ("Tensor", "x = tj.tensor(np.ones((256, 256), np.float32))\nx"),
    ("memory()", "tj.memory()"),
    ("tidy scope", 'with tj.tidy("step") as scope:\n    (x * 2).sum()\nscope'),
    ("live_tensors()", "tj.live_tensors()"),
    (
        "leak report",
        "with tj.check_leaks(allowance=1) as checker:\n    leaked = x + 1\nchecker.report",
    ),
    ("profile()", "tj.profile(lambda: x * 3)"),
    (
        "timeline",
        "with tj.timeline() as tl:\n"
        '    with tj.tidy("load"):\n'
        "        params = [tj.keep(tj.tensor(np.ones(4096 * (i + 1), np.float32)))\n"
        "                  for i in range(3)]\n"
        '    with tj.tidy("step"):\n'
        "        for _ in range(3):\n"
        "            (params[0] * 2 + params[1][:4096]).sum()\n"
        "tl",
    ),
]
NAMES = [name for name, _ in CELLS]
SMALL = [name for name in NAMES if name and name != "timeline"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _executed() -> Any:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source) for _, source in CELLS]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}  # fmt: skip
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3").execute()
    return nb


def _html_of(cell: Any) -> str:
    for out in cell.get("outputs", []):
        if "text/html" in out.get("data", {}):
            return str(out["data"]["text/html"])
    raise AssertionError(f"no HTML output in cell {cell.source!r}: {cell.get('outputs')}")


# -- the server -----------------------------------------------------------------------------------


class Lab:
    """A JupyterLab server of this module: where it is, its folders, its process."""

    def __init__(self, where: pathlib.Path, nb: Any) -> None:
        self.root = where / "root"
        self.data = where / "data"
        self.settings = where / "settings"
        for path in (self.root, self.data, self.settings, where / "config", where / "runtime",
                     where / "workspaces"):  # fmt: skip
            path.mkdir()
        cells = zip(CELLS, nb.cells, strict=True)
        self.outputs = {name: _html_of(cell) for (name, _), cell in cells if name}
        # trusted: signed with the notary the server uses (the same data folder)
        with NotebookNotary(data_dir=str(self.data)) as notary:
            notary.sign(nb)
            nbformat.write(nb, self.root / "trusted.ipynb")
            # untrusted: another notebook (the signature store knows notebooks by content)
            other = copy.deepcopy(nb)
            other.metadata["title"] = "a copy someone else ran"
            assert notary.check_signature(nb) and not notary.check_signature(other)
            nbformat.write(other, self.root / "untrusted.ipynb")
        # no requests to the internet; every cell in the DOM (no windowing)
        news = {"fetchNews": "false", "checkForUpdates": False}
        self._settings(
            ("apputils-extension", "notification", news),
            ("notebook-extension", "tracker", {"windowingMode": "none"}),
            ("extensionmanager-extension", "plugin", {"enabled": False}),
        )
        self.theme("light")
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, JUPYTER_DATA_DIR=str(self.data), JUPYTER_PLATFORM_DIRS="1",
                   JUPYTER_CONFIG_DIR=str(where / "config"),
                   JUPYTER_RUNTIME_DIR=str(where / "runtime"))  # fmt: skip
        self.log_path = where / "server.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1",
             f"--port={self.port}", "--port-retries=0", f"--IdentityProvider.token={TOKEN}",
             f"--ServerApp.root_dir={self.root}", f"--LabApp.user_settings_dir={self.settings}",
             f"--LabApp.workspaces_dir={where / 'workspaces'}",
             "--ServerApp.terminals_enabled=False",
             *(["--allow-root"] if os.geteuid() == 0 else [])],  # CI containers run as root
            env=env, cwd=self.root, stdout=self._log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip

    def _settings(self, *plugins: tuple[str, str, dict[str, Any]]) -> None:
        for package, plugin, values in plugins:
            folder = self.settings / "@jupyterlab" / package
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{plugin}.jupyterlab-settings").write_text(json.dumps(values))

    def theme(self, theme: str) -> None:
        """The theme of the next page load (the server reads the settings on each request)."""
        self._settings(("apputils-extension", "themes", {"theme": THEMES[theme]}))

    def wait_ready(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                with urllib.request.urlopen(f"{self.url}/api/status?token={TOKEN}", timeout=5):
                    return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.3)
        raise AssertionError(f"JupyterLab did not start:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # the server shuts its kernels down
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)  # its session: the kernels too
                self.proc.wait()
        self._log.close()


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Iterator[Lab]:
    nb = _executed()  # before the server starts: the two share the two cores
    server = Lab(tmp_path_factory.mktemp("jupyterlab"), nb)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    d = headless_chromium(1280, 1000)
    try:
        yield d
    finally:
        d.quit()


def _scheme(driver: Any, scheme: str) -> None:
    driver.execute_cdp_cmd(
        "Emulation.setEmulatedMedia",
        {"features": [{"name": "prefers-color-scheme", "value": scheme}]},
    )


def _goto(driver: Any, url: str) -> None:
    """Open ``url`` with an empty console log (leaving JupyterLab may log its beforeunload)."""
    driver.get("about:blank")
    driver.get_log("browser")
    driver.get(url)


def _severe(driver: Any) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


# -- what is read from the page -------------------------------------------------------------------

_HELPERS = (
    COLOUR_JS
    + """
// every display root: .tjx (small displays) and .tjtl (the timeline)
const measure = (name, root, out) => {
  root.querySelectorAll('details').forEach(d => { d.open = true; });
  for (const el of [root, ...root.querySelectorAll('*')]) {
    const text = ownText(el);
    if (!text || !el.getClientRects().length || el.closest('title, script, style')) continue;
    const style = getComputedStyle(el);
    if (style.visibility === 'hidden' || +style.opacity === 0) continue;
    const bg = behind(el);
    const ink = el.closest('svg') ? style.fill : style.color;
    const ratio = contrast(over(rgba(ink), bg), bg);
    out.texts++;
    if (ratio < 4.5) out.low.push([name, text.slice(0, 40), +ratio.toFixed(2), ink, bg]);
  }
  const isNumber = (cell) => cell.classList.contains('n') || cell.classList.contains('tj-num');
  for (const cell of root.querySelectorAll('td, th')) {
    if (!cell.textContent.trim() || !cell.getClientRects().length) continue;
    // a header is a number column's when the cells under it are numbers
    const column = [...cell.closest('table').rows].map(r => r.cells[cell.cellIndex])
      .filter(c => c && c.tagName === 'TD');
    const number = isNumber(cell) || (cell.tagName === 'TH' && column.some(isNumber));
    const align = getComputedStyle(cell).textAlign;
    number ? out.numbers++ : out.words++;
    const ok = number ? align === 'right' : (align === 'left' || align === 'start');
    if (!ok) out.misaligned.push([name, cell.textContent.trim().slice(0, 30), align]);
  }
};
const fresh = () => ({texts: 0, low: [], numbers: 0, words: 0, misaligned: [], bars: []});
// a bar: its height, and the contrast of its fill against its track (or null when empty)
const bars = (name, root, out) => {
  for (const bar of root.querySelectorAll('.bar')) {
    const page = behind(bar.parentElement);
    const track = over(rgba(getComputedStyle(bar).backgroundColor), page);
    const fill = bar.firstElementChild;
    const filled = fill && fill.getBoundingClientRect().width > 0;
    const ink = filled ? over(rgba(getComputedStyle(fill).backgroundColor), track) : null;
    out.bars.push([name, bar.getBoundingClientRect().height,
                   ink && +contrast(ink, track).toFixed(2)]);
  }
};
"""
)

# In JupyterLab: per code cell, the display in its output area, by the names given.
_LAB = (
    "const names = arguments[0];"
    + _HELPERS
    + """
const cells = [...document.querySelectorAll('.jp-Notebook .jp-CodeCell')];
const out = Object.assign(fresh(), {
  cells: cells.length, theme: document.body.dataset.jpThemeName,
  light: document.body.dataset.jpThemeLight, found: {}, timeline: null,
  styles: document.querySelectorAll('.jp-OutputArea-output style').length});
cells.forEach((cell, i) => {
  const name = names[i];
  if (!name) return;
  const roots = cell.querySelectorAll('.jp-OutputArea-output .tjx, .jp-OutputArea-output .tjtl');
  out.found[name] = roots.length;
  roots.forEach(root => { measure(name, root, out); bars(name, root, out); });
});
const tl = document.querySelector('.jp-OutputArea-output .tjtl');
if (tl) {
  const t = {ready: !!tl.dataset.ready, svgs: [], areas: 0, images: [], loose: [], tips: 0,
             text: tl.innerText};
  for (const svg of tl.querySelectorAll('svg')) {
    const r = svg.getBoundingClientRect();
    t.svgs.push({cls: svg.getAttribute('class'), width: r.width, height: r.height});
  }
  t.areas = tl.querySelectorAll('svg.tj-svg .tj-area').length;
  t.tips = tl.querySelectorAll('.tj-tip:not([hidden])').length;
  t.swatches = [...tl.querySelectorAll('.tj-legend .tj-sw')].map(
    sw => [rgba(getComputedStyle(sw).backgroundColor)[3], sw.getBoundingClientRect().width]);
  for (const img of tl.querySelectorAll('img')) {
    const r = img.getBoundingClientRect();
    t.images.push({ok: img.complete && img.naturalWidth > 0, width: r.width, height: r.height,
                   alt: img.alt, src: img.src});
  }
  // text shown outside the title, subtitle, legend, table and (live) chart: spilled chart text
  const walk = document.createTreeWalker(tl, NodeFilter.SHOW_TEXT);
  for (let n = walk.nextNode(); n; n = walk.nextNode()) {
    const text = n.textContent.trim();
    if (!text || !n.parentElement.getClientRects().length) continue;
    if (!n.parentElement.closest('h2, p, .tj-dev, .tj-legend, table, svg.tj-svg, .tj-tip, '
                                 + '.tj-devices, script, style'))
      t.loose.push(text.slice(0, 60));
  }
  out.timeline = t;
}
return out;
"""
)

# Whether the notebook has rendered: every display there, the theme applied, the chart final.
_READY = """
const [names, theme, trusted] = arguments;
if (document.body.dataset.jpThemeName !== theme) return false;
const cells = [...document.querySelectorAll('.jp-Notebook .jp-CodeCell')];
if (cells.length !== names.length) return false;
const shown = '.jp-OutputArea-output .tjx, .jp-OutputArea-output .tjtl';
for (let i = 0; i < names.length; i++)
  if (names[i] && !cells[i].querySelector(shown)) return false;
const tl = document.querySelector('.jp-OutputArea-output .tjtl');
if (trusted) return !!tl.dataset.ready;
return [...tl.querySelectorAll('img')].every(img => img.complete);
"""


@pytest.fixture(scope="module")
def _views() -> dict[tuple[str, str], dict[str, Any]]:
    return {}


@pytest.fixture
def view(driver, lab, _views, request) -> dict[str, Any]:
    """The notebook (trusted or not) as JupyterLab shows it in a theme: what the page reads."""
    trust, theme = request.param
    if (trust, theme) not in _views:
        lab.theme(theme)
        _scheme(driver, SYSTEM[theme])
        _goto(driver, f"{lab.url}/lab/tree/{trust}.ipynb?reset&token={TOKEN}")
        try:
            WebDriverWait(driver, 60, poll_frequency=0.25).until(
                lambda d: d.execute_script(_READY, NAMES, THEMES[theme], trust == "trusted")
            )
            got = driver.execute_script(_LAB, NAMES)
            got["errors"] = _severe(driver)
        except TimeoutException:  # once per view, not once per test
            got = {"failed": f"the {trust} notebook did not render in {theme}:\n"
                             + str(driver.execute_script(_LAB, NAMES))[:3000]
                             + f"\nserver log:\n{lab.log()}"}  # fmt: skip
        _views[trust, theme] = got
    got = _views[trust, theme]
    if "failed" in got:
        pytest.fail(got["failed"])
    return got


def _ids(views: list[tuple[str, str]]) -> list[str]:
    return [f"{trust}-{theme}" for trust, theme in views]


# -- the tests ------------------------------------------------------------------------------------


@pytest.mark.parametrize("view", VIEWS, ids=_ids(VIEWS), indirect=True)
def test_every_display_renders_in_its_theme(view):
    assert view["cells"] == len(CELLS)
    assert view["found"] == {name: 1 for name in NAMES if name}, view["found"]


@pytest.mark.parametrize("view", VIEWS, ids=_ids(VIEWS), indirect=True)
def test_text_contrast_is_at_least_4_5(view):
    assert view["texts"] > 60, view
    assert view["low"] == [], view["low"][:8]


# Untrusted, JupyterLab drops the displays' <style> and its own rule right-aligns every cell:
# the cells carry their alignment inline (_html.table, the timeline's peak table).
ALIGNED = [pytest.param(v, id=f"{v[0]}-{v[1]}") for v in VIEWS]


@pytest.mark.parametrize("view", ALIGNED, indirect=True)
def test_text_columns_left_and_numbers_right(view):
    assert view["words"] > 15 and view["numbers"] > 15, view
    assert view["misaligned"] == [], (view["styles"], view["misaligned"])


# Untrusted, the bars lose their style sheet too: they carry their height and plain colours
# inline (_html.bar).
BARRED = ALIGNED


@pytest.mark.parametrize("view", BARRED, indirect=True)
def test_bars_show_their_fill(view):
    assert view["bars"], view  # memory()'s holders
    for name, height, ratio in view["bars"]:
        assert height >= 6, (name, height)
        assert ratio is None or ratio >= 3, (name, ratio)  # the fill stands out of its track


@pytest.mark.parametrize("view", VIEWS, ids=_ids(VIEWS), indirect=True)
def test_no_console_errors(view):
    assert view["errors"] == [], view["errors"][:5]


TRUSTED = [v for v in VIEWS if v[0] == "trusted"]
UNTRUSTED = [v for v in VIEWS if v[0] == "untrusted"]


@pytest.mark.parametrize("view", TRUSTED, ids=_ids(TRUSTED), indirect=True)
def test_a_trusted_notebook_shows_the_live_chart(view):
    tl = view["timeline"]
    assert tl["ready"], tl  # the script ran
    charts = [s for s in tl["svgs"] if "tj-svg" in (s["cls"] or "")]
    assert len(charts) == 1 and charts[0]["width"] > 300 and charts[0]["height"] > 100, tl
    assert tl["areas"] >= 3, tl  # an area per site
    shown = [img for img in tl["images"] if img["width"] or img["height"]]
    assert shown == [] and tl["tips"] == 0, tl  # the static image gone or hidden, no tooltip
    assert "Alive at the peak" in tl["text"]
    assert len(tl["swatches"]) >= 3 and all(a == 1 and w > 0 for a, w in tl["swatches"]), tl


@pytest.mark.parametrize("view", UNTRUSTED, ids=_ids(UNTRUSTED), indirect=True)
def test_an_untrusted_notebook_shows_the_chart_as_an_image(view):
    tl = view["timeline"]
    assert not tl["ready"] and tl["svgs"] == [], tl  # no script ran, the sanitizer took <svg>
    assert len(tl["images"]) == 1, tl["images"]
    (img,) = tl["images"]
    assert img["ok"] and img["width"] > 300 and img["height"] > 100, img
    assert "peak" in img["alt"]
    assert tl["loose"] == [] and tl["tips"] == 0, tl["loose"]  # no chart text spilled
    text = tl["text"]
    assert "Alive at the peak" in text and "By site, largest first: " in text
    assert not re.search(r"\d (B|KiB|MiB|GiB)\d|\d (ms|s|min)\+\d", text)  # "0 B5.0 MiB…"
    # the legend is the script's, with its chart; the image is the minimal picture: one area of
    # the live bytes, the peak line and its label
    assert tl["swatches"] == [], tl
    svg = base64.b64decode(img["src"].split("base64,", 1)[1]).decode("utf-8")
    assert svg.count('<path class="tj-area"') == 1, svg
    assert re.search(r'<g class="tj-peak"><line [^>]*/><text [^>]*>peak [\d.]+ KiB</text>', svg)


# -- a white host page under a dark OS ------------------------------------------------------------

_PAGE = (
    _HELPERS
    + """
const out = fresh();
for (const section of document.querySelectorAll('section[data-name]'))
  for (const root of section.querySelectorAll('.tjx, .tjtl'))
    measure(section.dataset.name, root, out);
out.roots = document.querySelectorAll('.tjx, .tjtl').length;
return out;
"""
)


def test_the_outputs_read_well_on_a_white_page_under_a_dark_os(driver, lab, tmp_path):
    sections = "".join(
        f'<section data-name="{html.escape(name)}"><h3>{html.escape(name)}</h3>{markup}</section>'
        for name, markup in lab.outputs.items()
    )
    page = tmp_path / "white.html"
    page.write_text(
        '<!doctype html><html><head><meta charset="utf-8"><title>export</title></head>'
        f'<body style="background:#fff;margin:8px">{sections}</body></html>',
        encoding="utf-8",
    )
    _scheme(driver, "dark")
    _goto(driver, page.as_uri())
    WebDriverWait(driver, 30).until(lambda d: d.execute_script(
        "return !!document.querySelector('.tjtl[data-ready]')"))  # fmt: skip
    assert driver.execute_script("return matchMedia('(prefers-color-scheme: dark)').matches")
    got = driver.execute_script(_PAGE)
    assert got["roots"] == len(lab.outputs) and got["texts"] > 60, got
    assert got["low"] == [], got["low"][:8]
    assert _severe(driver) == []
