"""The documentation site builds strictly, and a real browser finds the API reference."""

from __future__ import annotations

import html.parser
import os
import pathlib
import re
import subprocess
import sys

import pytest

import tidyjax

from .conftest import chromium
from .test_displays_browser import browser as browser  # the fixture: one Chromium per module

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _dom(browser: str, page: pathlib.Path) -> str:
    proc = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


class _Text(html.parser.HTMLParser):
    """The text a reader sees in a page: no tags, no scripts or styles."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: object) -> None:
        self._skip += tag in ("script", "style")

    def handle_endtag(self, tag: str) -> None:
        self._skip -= tag in ("script", "style")

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self.parts.append(data)


def page_text(page: pathlib.Path) -> str:
    parser = _Text()
    parser.feed(page.read_text(encoding="utf-8"))
    return "".join(parser.parts)


# What reStructuredText markup or a private name looks like once rendered as Markdown text.
RAW_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|attr|mod|data|exc|obj):`?\w|\w::(?:\s|$)")
PRIVATE = re.compile(r"\b_[A-Z]\w*\(|tidyjax\._\w+|Bases: (?:Tracker|_)|\b_[a-z]\w*\.[A-Za-z_]")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """The documentation site, built once with ``mkdocs build --strict``."""
    pytest.importorskip("mkdocs", reason="pip install -e '.[docs]'")
    out = tmp_path_factory.mktemp("docs") / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, NO_MKDOCS_2_WARNING="1"),
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return out


def test_the_markup_checks_catch_what_the_api_page_used_to_show():
    # Text of the API page as it was rendered before its docstrings were Markdown.
    old = (
        "tidyjax.tidy = _Tidy() module-attribute Bases: Tracker See\n:class:Scope for what a "
        "scope reports. Only an explicit :func:dispose frees it.\nExample::\nwith tidy(): "
        "(see _timeline_format.Codec)"
    )
    assert len(RAW_ROLE.findall(old)) == 3
    assert len(PRIVATE.findall(old)) == 3
    assert not RAW_ROLE.search("Example:\nwith tidy(): x = a[::2]  # https://x.org")
    assert not PRIVATE.search("Bases: TidyjaxError, RuntimeError; jax._src is JAX's")


def test_the_api_page_shows_no_sphinx_role_and_no_private_name(site):
    text = page_text(site / "api" / "index.html")
    assert "Run code in a scope that frees every buffer it created" in text
    roles = [text[max(m.start() - 60, 0) : m.end() + 20] for m in RAW_ROLE.finditer(text)]
    assert roles == [], "raw reStructuredText in docstrings (write Markdown: [`X`][tidyjax.X])"
    private = [text[max(m.start() - 60, 0) : m.end() + 20] for m in PRIVATE.finditer(text)]
    assert private == [], "private names on the API page"
    # Every cross-reference resolved (mkdocs --strict fails on an unknown one) into a link.
    api = (site / "api" / "index.html").read_text(encoding="utf-8")
    assert api.count('href="#tidyjax.Tensor"') >= 3
    assert 'href="#tidyjax.Tensor.dispose"' in api


def test_docs_build_strictly_and_the_api_page_shows_tidy(site):
    browser = chromium()
    api = _dom(browser, site / "api" / "index.html")
    assert 'id="tidyjax.tidy"' in api  # the entry, generated from the docstrings
    assert "Run code in a scope that frees every buffer it created" in api
    assert 'id="tidyjax.memory"' in api and "all_processes" in api
    guide = _dom(browser, site / "guide-tfjs" / "index.html")
    assert "Using a disposed Tensor raises" in guide  # the quickstart, on its guide


# The docs' pictures (written by ``python docs/screenshots.py``), each light and dark: the home
# page shows the displays, the plan guide a plan as a notebook cell's output.
DISPLAYS = ("timeline", "leaks", "memory")
PICTURES = (*DISPLAYS, "plan")
IMG = ROOT / "docs" / "img"


def _picture(path: pathlib.Path) -> tuple[tuple[int, int], float]:
    """A PNG's size in pixels and its mean luminance (0 black to 255 white)."""
    from PIL import Image, ImageStat

    with Image.open(path) as image:
        return image.size, float(ImageStat.Stat(image.convert("L")).mean[0])


def test_each_picture_is_small_sharp_and_dark_where_it_should_be():
    pytest.importorskip("PIL", reason="Pillow comes with matplotlib (the notebooks extra)")
    for name in PICTURES:
        light, dark = IMG / f"{name}.png", IMG / f"{name}-dark.png"
        for path in (light, dark):
            assert path.stat().st_size < 150_000, path
        (size, light_luminance), (dark_size, dark_luminance) = _picture(light), _picture(dark)
        assert size[0] >= 1200, f"{light}: rendered at 2x, wider than 600 CSS px"
        assert size == dark_size, name
        assert light_luminance > 200 and dark_luminance < 80, name


def test_the_readme_picture_follows_the_readers_colour_scheme():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    picture = re.search(r"<picture>(.*?)</picture>", readme, re.S)
    assert picture is not None
    assert '<source media="(prefers-color-scheme: dark)" srcset="docs/img/timeline-dark.png">' in (
        picture.group(1)
    )
    assert 'src="docs/img/timeline.png"' in picture.group(1)
    # Every local image the README shows exists.
    for src in re.findall(r'(?:src|srcset)="(docs/[^"]+)"|\]\((docs/[^)#]+)', readme):
        assert (ROOT / "".join(src)).is_file(), src


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_the_home_page_shows_each_display_in_the_readers_scheme(site, browser, scheme):
    home = (site / "index.html").as_uri()
    browser.open(home, scheme)
    browser.evaluate("localStorage.clear()")  # a reader who never chose a scheme on this site
    errors = browser.open(home, scheme)
    assert errors == []
    shown = browser.evaluate(
        "[...document.querySelectorAll('article img')]"
        ".filter(i => i.offsetParent !== null && i.complete && i.naturalWidth > 0)"
        ".map(i => i.getAttribute('src'))"
    )
    ending = ".png#only-light" if scheme == "light" else "-dark.png#only-dark"
    assert shown == [f"img/{name}{ending}" for name in DISPLAYS]
    # The guides' pictures too: the timeline's, the plan's.
    for guide, name in (("guide-timeline", "timeline"), ("guide-plan", "plan")):
        browser.open((site / guide / "index.html").as_uri(), scheme)
        shown = browser.evaluate(
            "[...document.querySelectorAll('article img')]"
            ".filter(i => i.offsetParent !== null && i.naturalWidth > 0)"
            ".map(i => i.getAttribute('src'))"
        )
        assert shown == [f"../img/{name}{ending}"]


@pytest.mark.skipif(
    not os.environ.get("TIDYJAX_EXPECT_INSTALLED"), reason="only when testing an installed wheel"
)
def test_the_installed_wheel_is_what_runs_and_it_is_typed():
    where = pathlib.Path(tidyjax.__file__).resolve().parent
    assert "site-packages" in where.parts, where
    assert (where / "py.typed").is_file()
    for module in ("numpy", "lax", "nn", "random", "pytest_plugin", "ipython"):
        __import__(f"tidyjax.{module}")
