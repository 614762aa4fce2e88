"""The displays in the hosts that change them: headless Chromium pages that reproduce each one.

- An untrusted notebook: JupyterLab runs output HTML through its sanitizer (``sanitize-html``
  with the options of ``packages/apputils/src/sanitizer.ts``): no ``<svg>``, ``<script>`` or
  ``<style>``, no ``data-*`` or ``on*`` attributes, inline styles only of listed properties with
  plain values, ``<img>`` with any ``src``. Where Node.js finds the ``sanitize-html`` package
  (``NODE_PATH``, or ``TIDYJAX_SANITIZE_HTML`` naming a ``node_modules`` folder) the real
  sanitizer runs; otherwise a Python copy of those rules does.
- A white host page (classic Notebook, nbviewer, a static export) under a dark OS, and pages that
  mark their theme (VS Code, PyData Sphinx, JupyterLab): text contrast of at least 4.5:1.
- JupyterLab's right-aligning table rule injected after the displays: text columns stay left,
  numbers right.

Real JupyterLab runs are out of scope here.
"""

from __future__ import annotations

import base64
import html
import html.parser
import json
import os
import pathlib
import re
import shutil
import subprocess

import pytest

import tidyjax as tj
from tidyjax import _timeline as tlm
from tidyjax import tidy

from .conftest import tensors_at_sites
from .headless import COLOUR_JS
from .test_displays_browser import _MEASURE, JUPYTERLAB_DARK, JUPYTERLAB_LIGHT, _local_states
from .test_displays_browser import browser as browser  # the fixture: one Chromium per module

# -- JupyterLab's sanitizer ----------------------------------------------------------------------


def _words(text: str) -> list[str]:
    return text.split()


# The options of JupyterLab's sanitizer (packages/apputils/src/sanitizer.ts, JupyterLab 4).
_TAGS = set(
    _words(
        "a abbr acronym address area article aside audio b bdi bdo big blockquote br button "
        "canvas caption center cite code col colgroup colspan command data datalist dd del "
        "details dfn dir div dl dt em fieldset figcaption figure font footer form h1 h2 h3 h4 h5 "
        "h6 header hgroup hr i img input ins kbd label legend li map mark menu meter nav nobr ol "
        "optgroup option output p pre progress q rowspan s samp section select small source span "
        "strike strong sub summary sup table tbody td textarea tfoot th thead time tr track tt u "
        "ul var video wbr"
    )
)
_ATTRIBUTES: dict[str, list[str]] = {
    "*": _words(
        "class dir draggable hidden id inert itemprop itemref itemscope lang spellcheck style "
        "title translate"
    ),
    "a": _words("accesskey coords href hreflang name rel shape tabindex target type"),
    "button": _words("accesskey disabled name tabindex type value"),
    "details": ["open"],
    "div": ["align"],
    "img": _words("align alt border height hspace ismap name src usemap vspace width"),
    "li": ["type", "value"],
    "ol": _words("compact reversed start type"),
    "p": ["align"],
    "table": _words("align bgcolor border cellpadding cellspacing frame rules summary width"),
    "td": _words(
        "abbr align axis bgcolor char charoff colspan headers height nowrap rowspan scope "
        "valign width"
    ),
    "th": _words(
        "abbr align axis bgcolor char charoff colspan headers height nowrap rowspan scope "
        "valign width"
    ),
    "ul": ["compact", "type"],
}
# Inline style properties it allows (a subset of its list: what displays could use). Its value
# patterns accept plain values (lengths, keywords, #hex, rgb()), never var() or color-mix().
_STYLES = _words(
    "background background-color border border-bottom border-radius color display font-size "
    "font-weight height line-height margin max-width padding text-align vertical-align "
    "white-space width"
)
_PLAIN = r"^([^()]*|rgba?\([\d\s.,%]+\))$"
# Tags it drops with their text; other tags it drops keep their text.
_NON_TEXT = {"script", "style", "textarea", "option", "noscript"}
_VOID = {"area", "br", "col", "hr", "img", "input", "source", "track", "wbr"}
# Attributes that may be empty; sanitize-html drops any other one that is (``hidden`` included).
_BOOLEAN = set(
    _words(
        "autoplay checked compact controls default disabled inert ismap itemscope loop multiple "
        "muted nohref noshade novalidate nowrap open readonly required reversed selected"
    )
)

_NODE = """const fs = require('fs'), sanitize = require('sanitize-html');
const o = JSON.parse(fs.readFileSync(process.argv[1], 'utf8'));
const plain = new RegExp(o.plain, 'i'), styles = {};
for (const p of o.styles) styles[p] = [plain];
process.stdout.write(sanitize(fs.readFileSync(0, 'utf8'), {
  allowedTags: o.tags, allowedAttributes: o.attributes, allowedStyles: {'*': styles},
  allowedSchemesByTag: {img: sanitize.defaults.allowedSchemes.concat(['attachment'])},
  allowedSchemesAppliedToAttributes: ['href', 'cite']}));
"""


def _node_env() -> dict[str, str] | None:
    """The environment in which ``node`` finds sanitize-html, or None."""
    node = shutil.which("node")
    if node is None:
        return None
    env = dict(os.environ)
    if os.environ.get("TIDYJAX_SANITIZE_HTML"):
        env["NODE_PATH"] = os.environ["TIDYJAX_SANITIZE_HTML"]
    found = subprocess.run(
        [node, "-e", "require.resolve('sanitize-html')"], env=env, capture_output=True, check=False
    )
    return env if found.returncode == 0 else None


class _Sanitizer(html.parser.HTMLParser):
    """The same rules in Python: what sanitize-html does with JupyterLab's options."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.out: list[str] = []
        self.skip = 0  # inside a dropped <script> or <style>: its text goes too

    def _attrs(self, tag: str, attrs: list[tuple[str, str | None]]) -> str:
        ok = set(_ATTRIBUTES["*"]) | set(_ATTRIBUTES.get(tag, ()))
        out = []
        for name, value in attrs:
            if name not in ok:
                continue
            value = value or ""
            if not value and name not in _BOOLEAN:
                continue
            if name == "style":
                keep = []
                for decl in value.split(";"):
                    prop, _, val = decl.partition(":")
                    if prop.strip() in _STYLES and re.match(_PLAIN, val.strip(), re.I):
                        keep.append(f"{prop.strip()}:{val.strip()}")
                if not keep:
                    continue
                value = ";".join(keep)
            out.append(f' {name}="{html.escape(value)}"')
        return "".join(out)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _NON_TEXT and tag not in _TAGS:
            self.skip += 1
        elif not self.skip and tag in _TAGS:
            self.out.append(f"<{tag}{self._attrs(tag, attrs)}>")

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if not self.skip and tag in _TAGS:
            self.out.append(f"<{tag}{self._attrs(tag, attrs)}>")
            if tag not in _VOID:
                self.out.append(f"</{tag}>")

    def handle_endtag(self, tag: str) -> None:
        if tag in _NON_TEXT and tag not in _TAGS:
            self.skip = max(0, self.skip - 1)
        elif not self.skip and tag in _TAGS and tag not in _VOID:
            self.out.append(f"</{tag}>")

    def handle_data(self, data: str) -> None:
        if not self.skip:
            self.out.append(html.escape(data, quote=False))


def sanitize(markup: str, tmp_path: pathlib.Path) -> str:
    """``markup`` as an untrusted JupyterLab notebook shows it."""
    env = _node_env()
    if env is None:
        parser = _Sanitizer()
        parser.feed(markup)
        parser.close()
        return "".join(parser.out)
    options = tmp_path / "sanitizer.json"
    options.write_text(json.dumps({"tags": sorted(_TAGS), "attributes": _ATTRIBUTES,
                                   "styles": _STYLES, "plain": _PLAIN}))  # fmt: skip
    done = subprocess.run(
        ["node", "-e", _NODE, str(options)], input=markup, env=env, capture_output=True,
        text=True, check=True, timeout=120,
    )  # fmt: skip
    return done.stdout


def test_the_sanitizer_drops_what_jupyterlab_drops(tmp_path):
    dirty = (
        '<div class="a" data-x="1" onclick="f()" style="width:5px;color:var(--c)">'
        "<style>p{color:red}</style><script>alert(1)</script>"
        '<svg><text x="1">axis</text></svg><img src="data:image/svg+xml;base64,AAAA"></div>'
        "<p hidden>shown</p><details open><summary>s</summary></details>"
    )
    clean = sanitize(dirty, tmp_path)
    assert "<svg" not in clean and "<script" not in clean and "<style" not in clean
    assert "alert" not in clean and "color:red" not in clean and "axis" in clean
    assert "onclick" not in clean and "data-x" not in clean and "var(" not in clean
    assert 'src="data:image/svg+xml;base64,AAAA"' in clean and "width:5px" in clean
    assert "<p>shown</p>" in clean and "<details open" in clean  # an empty hidden goes


# -- pages ---------------------------------------------------------------------------------------


def _recording() -> tlm.Timeline:
    """A real recording: 6 sites, two scope bands, one peak."""
    with tj.timeline() as tl:
        params = tidy.run("load_params", tensors_at_sites, 6, "model.py")
        with tidy("release"):
            tj.dispose(params[:3])
    tj.dispose(params)
    return tl


def _two_devices() -> tlm.Timeline:
    tl = tlm.Timeline()
    tl._loaded = True  # made of TimelineEvents, as a loaded one
    tl.start_time = 0.0
    for i, (device, nbytes) in enumerate([("gpu:0", 4096), ("gpu:1", 1024), ("gpu:1", 2048)]):
        ev = tlm.TimelineEvent("alloc", i * 1e-3, nbytes, device, None, "", (nbytes // 4,),
                               "float32", (i + 1,), i + 1, "", ((device, nbytes),))  # fmt: skip
        tl._append(ev, nbytes)
    return tl


@pytest.fixture(scope="module")
def displays() -> dict[str, tuple[str, str]]:
    states = _local_states()
    states["Timeline"] = (_recording()._repr_html_(), "")
    states["Timeline, two devices"] = (_two_devices()._repr_html_(), "")
    return states


def _write(path: pathlib.Path, body: str, *, head: str = "", html_attrs: str = "",
           body_attrs: str = "", tail: str = "") -> str:  # fmt: skip
    path.write_text(
        f'<!doctype html><html{html_attrs}><head><meta charset="utf-8"><title>host</title>'
        f"{head}</head><body{body_attrs}>{body}{tail}</body></html>",
        encoding="utf-8",
    )
    return path.as_uri()


def _sections(displays: dict[str, tuple[str, str]], only: str = "") -> str:
    return "".join(
        f'<section data-state="{html.escape(name)}"><h3>{html.escape(name)}</h3>{markup}</section>'
        for name, (markup, _) in displays.items()
        if only in name
    )


def _wrapper(variables: dict[str, str], content: str) -> str:
    """An output area of JupyterLab with its theme's variables."""
    style = "".join(f"{k}:{v};" for k, v in variables.items())
    style += "background:var(--jp-layout-color0);color:var(--jp-content-font-color0);padding:4px"
    return f'<div class="jp-RenderedHTMLCommon jp-RenderedHTML" style="{style}">{content}</div>'


# -- (a) an untrusted notebook ---------------------------------------------------------------------

_UNTRUSTED = """(() => {
  const out = {images: [], loose: [], shown: [], swatches: [], tips: 0, svgs: 0};
  for (const root of document.querySelectorAll('.tjtl')) {
    out.tips += root.querySelectorAll('.tj-tip').length;
    out.svgs += root.querySelectorAll('svg').length;
    for (const img of root.querySelectorAll('img')) {
      const r = img.getBoundingClientRect();
      out.images.push({ok: img.complete && img.naturalWidth > 0, width: r.width,
                       height: r.height, alt: img.alt});
    }
    const walk = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
    for (let n = walk.nextNode(); n; n = walk.nextNode()) {
      const text = n.textContent.trim();
      if (!text || !n.parentElement.getClientRects().length) continue;
      out.shown.push(text);
      if (!n.parentElement.closest('h2, p, .tj-dev, .tj-legend, table'))
        out.loose.push(text.slice(0, 60));
    }
    for (const sw of root.querySelectorAll('.tj-legend span')) {
      const s = getComputedStyle(sw);
      out.swatches.push([s.backgroundColor, sw.getBoundingClientRect().width]);
    }
  }
  return out;
})()"""


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_an_untrusted_notebook_shows_the_timeline_chart_as_an_image(
    browser, displays, tmp_path, theme
):
    variables = JUPYTERLAB_LIGHT if theme == "light" else JUPYTERLAB_DARK
    one, two = displays["Timeline"][0], displays["Timeline, two devices"][0]
    clean = [sanitize(markup, tmp_path) for markup in (one, two)]
    for markup in clean:
        assert "<svg" not in markup and "<script" not in markup and "<style" not in markup
        assert 'src="data:image/svg+xml;base64,' in markup
    url = _write(tmp_path / "untrusted.html", _wrapper(variables, "".join(clean)))
    assert browser.open(url, theme) == []
    got = browser.evaluate(_UNTRUSTED)
    assert got["svgs"] == 0 and got["tips"] == 0  # no stray, empty tooltip box
    # one chart, then one per device, each a loaded image of a readable size
    assert len(got["images"]) == 3, got["images"]
    for img in got["images"]:
        assert img["ok"] and img["width"] > 300 and img["height"] > 100, img
    assert "gpu:1" in got["images"][2]["alt"]
    # no text of the SVG spills out: every text shown belongs to the title, the subtitle, a
    # device's name, the sites' line or the table
    assert got["loose"] == [], got["loose"]
    shown = " ".join(got["shown"])
    assert "Alive at the peak" in shown and "model.py:1" in shown
    # each site named by its chain of user frames, outer to inner
    largest = (
        r"By site, largest first: [^·]+ in tensors_at_sites → model\.py:6 in <module> \(6\.0 KiB"
    )
    assert re.search(largest, shown), shown
    assert "gpu:1 · peak 3.0 KiB" in shown  # each device's chart under its name
    assert not re.search(r"\d (ms|s|min)\+\d|\d (B|KiB|MiB|GiB)\d", shown)  # no axis labels run on
    # the legend is the script's (with the chart it names): no swatches without it
    assert got["swatches"] == [], got["swatches"]
    # each image is the minimal picture: one area of the live bytes, the peak line, its label
    images = [
        base64.b64decode(b).decode("utf-8")
        for markup in clean
        for b in re.findall(r'src="data:image/svg\+xml;base64,([^"]+)"', markup)
    ]
    peaks = [re.findall(r'<g class="tj-peak"><line [^>]*/><text [^>]*>(peak [^<]+)</text>', svg)
             for svg in images]  # fmt: skip
    assert [svg.count('<path class="tj-area"') for svg in images] == [1, 1, 1]
    assert peaks[1:] == [["peak 4.0 KiB"], ["peak 3.0 KiB"]] and len(peaks[0]) == 1, peaks


def test_an_untrusted_notebook_keeps_the_light_displays_readable(browser, displays, tmp_path):
    light = {k: v for k, v in displays.items() if not k.startswith("Timeline")}
    clean = {k: (sanitize(m, tmp_path), t) for k, (m, t) in light.items()}
    for name, (markup, _) in clean.items():
        assert "<style" not in markup and "{" not in markup, name  # no style sheet as text
    url = _write(tmp_path / "light.html", _wrapper(JUPYTERLAB_LIGHT, _sections(clean)))
    assert browser.open(url, "light") == []
    text = browser.evaluate("document.body.innerText")
    assert "tensors" in text and "created at" in text


# -- (b) dark OS on a white host, and hosts that mark their theme ----------------------------------

_CONTRAST = (
    "(() => {\n"
    + COLOUR_JS
    + """
  const low = [];
  let texts = 0;
  for (const el of document.querySelectorAll('.tjtl, .tjtl *')) {
    const own = [...el.childNodes].some(n => n.nodeType === 3 && n.textContent.trim());
    if (!own || !el.getClientRects().length || el.closest('svg')) continue;
    const bg = behind(el), fg = over(rgba(getComputedStyle(el).color), bg);
    const [x, y] = [lum(fg), lum(bg)].sort((p, q) => q - p);
    texts++;
    if ((x + 0.05) / (y + 0.05) < 4.5) low.push([el.textContent.slice(0, 40), fg, bg]);
  }
  return {texts, low};
})()"""
)

# host -> (the OS's scheme, <html> attributes, <body> attributes, the JupyterLab variables)
HOSTS: dict[str, tuple[str, str, str, dict[str, str] | None]] = {
    "white page, dark OS": ("dark", "", "", None),
    "white page with colours, dark OS": ("dark", "", ' style="background:#fff;color:#222"', None),
    "VS Code dark": ("light", "", ' class="vscode-dark" style="background:#1e1e1e;color:#ccc"',
                     None),
    "VS Code light, dark OS": ("dark", "", ' class="vscode-light" style="background:#fff"', None),
    "PyData Sphinx dark": ("light", ' data-theme="dark"',
                           ' style="background:#14181e;color:#ced6dd"', None),
    "JupyterLab dark, light OS": ("light", "", ' data-jp-theme-light="false"', JUPYTERLAB_DARK),
    "JupyterLab light, dark OS": ("dark", "", ' data-jp-theme-light="true"', JUPYTERLAB_LIGHT),
}  # fmt: skip


@pytest.mark.parametrize("host", list(HOSTS))
def test_every_display_reads_well_on_every_host(browser, displays, tmp_path, host):
    scheme, html_attrs, body_attrs, variables = HOSTS[host]
    content = _sections(displays)
    if variables:
        content = _wrapper(variables, content)
    url = _write(tmp_path / "host.html", content, html_attrs=html_attrs, body_attrs=body_attrs)
    assert browser.open(url, scheme) == []
    got = browser.evaluate(_MEASURE)
    assert got["texts"] > 200, got
    assert got["lowContrast"] == [], got["lowContrast"][:5]
    assert got["badBars"] == [], got["badBars"][:5]
    timeline = browser.evaluate(_CONTRAST)
    assert timeline["texts"] > 20 and timeline["low"] == [], timeline["low"][:5]


# -- (c) JupyterLab's right-aligned table cells --------------------------------------------------

# JupyterLab's rendermime rules for table cells (packages/rendermime/style/base.css), placed
# after the displays so that only their selectors can win.
_JUPYTERLAB_CELLS = """<style>
.jp-RenderedHTMLCommon table{border-collapse:collapse;border:none;table-layout:fixed;
  margin-left:auto;margin-right:auto}
.jp-RenderedHTMLCommon td,.jp-RenderedHTMLCommon th,.jp-RenderedHTMLCommon tr{
  text-align:right;vertical-align:middle;padding:.5em;line-height:normal;white-space:normal;
  max-width:none;border:none}
:not(.jp-RenderedMarkdown).jp-RenderedHTMLCommon td,
:not(.jp-RenderedMarkdown).jp-RenderedHTMLCommon th{text-align:right}
.jp-RenderedHTMLCommon th{font-weight:bold}
</style>"""

_ALIGNMENT = """(() => {
  const out = {text: 0, numbers: 0, wrong: []};
  for (const cell of document.querySelectorAll('.tjx td, .tjx th, .tjtl td, .tjtl th')) {
    if (!cell.textContent.trim()) continue;
    const number = cell.classList.contains('n') || cell.classList.contains('tj-num');
    const align = getComputedStyle(cell).textAlign;
    number ? out.numbers++ : out.text++;
    if (align !== (number ? 'right' : 'left'))
      out.wrong.push([cell.closest('[data-state]').dataset.state, cell.textContent.slice(0, 30),
                      align]);
  }
  return out;
})()"""


def test_text_columns_stay_left_and_numbers_right_under_jupyterlab_rules(
    browser, displays, tmp_path
):
    content = _wrapper(JUPYTERLAB_LIGHT, _sections(displays))
    url = _write(tmp_path / "cells.html", content, tail=_JUPYTERLAB_CELLS)
    assert browser.open(url, "light") == []
    got = browser.evaluate(_ALIGNMENT)
    assert got["text"] > 50 and got["numbers"] > 50, got
    assert got["wrong"] == [], got["wrong"][:8]
