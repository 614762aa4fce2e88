"""Every ```python example of the documentation runs as written, and every relative link in it
leads to a file and a heading that exist.

The pages: README.md (run by ``tests/test_readme.py``) and each ``docs/*.md`` (run here).

How a block runs: each ```python block is compiled with its page's path as the file name, so
creation sites and tracebacks name the page, and executed in a fresh namespace, in a temporary
working directory (a file an example writes lands there). The blocks of a page do not share
names. The conftest fixture then checks that the block left no Tensor alive.

A comment on the line just before a block changes how it runs:

* ``<!-- no-run: REASON -->``: not run. Only for a block that cannot run in one test process: an
  excerpt of a larger program, a job of several processes. REASON is required and shown in the
  skip; keep these few (``test_few_blocks_are_left_unrun`` counts them).
* ``<!-- ipython -->``: notebook cells, each starting at a ``# In[n]`` comment line, run one
  after another in IPython's ``InteractiveShell`` with the output history on, so magics
  (``%load_ext tidyjax``, ``%%tidy``, ``%tidyjax auto on``) work; skipped without IPython.

One rule is read from the code, as the README's tests always have: a block containing
``# was: @jax.jit`` (the standard JAX step under ``tidyjax.jit``) needs JAX 0.10.2 or later and
is skipped on older JAX; the page says so next to it.
"""

from __future__ import annotations

import dataclasses
import gc
import pathlib
import re
import textwrap
import unicodedata

import pytest

import tidyjax as tj
from tidyjax._jaxdoors import BIND_CONVERSION

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
GUIDES = sorted(DOCS.glob("*.md"))
PAGES = [README, *GUIDES]

# A fenced block: its indent (inside a list item), language, body, and the closing fence.
FENCE = re.compile(r"^([ \t]*)```([\w+-]*)[^\n]*\n(.*?)^\1```[ \t]*$", re.S | re.M)
MARKER = re.compile(r"<!--\s*(no-run|ipython)\s*(?::\s*(.*?))?\s*-->\s*$")
LANGUAGES = {"python", "text", "bash", "diff"}
MOST_UNRUN = 3  # the home page's three excerpts of docs/screenshots.py


@dataclasses.dataclass(frozen=True)
class Block:
    """One fenced code block of a page."""

    page: pathlib.Path
    line: int  # the page's line of the block's first code line
    lang: str
    code: str
    marker: str | None  # "no-run" or "ipython", from the comment just before the block
    reason: str | None  # a no-run marker's reason

    @property
    def id(self) -> str:
        return f"{self.page.name}:{self.line}"


def blocks(page: pathlib.Path) -> list[Block]:
    """The fenced code blocks of ``page``, in order."""
    text = page.read_text(encoding="utf-8")
    found = []
    for m in FENCE.finditer(text):
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = MARKER.search(before)
        found.append(
            Block(
                page=page,
                line=text.count("\n", 0, m.start(3)) + 1,
                lang=m.group(2),
                code=textwrap.dedent(m.group(3)),
                marker=marker.group(1) if marker else None,
                reason=marker.group(2) if marker else None,
            )
        )
    return found


def python_blocks(pages: list[pathlib.Path]) -> list[Block]:
    return [b for page in pages for b in blocks(page) if b.lang == "python"]


def _run_cells(code: str) -> None:
    """Run notebook cells (split at ``# In[n]`` lines) in IPython, as a notebook would."""
    pytest.importorskip("IPython")
    from IPython.core.interactiveshell import InteractiveShell

    cells = [c for c in re.split(r"^# In\[\d*\].*\n", code, flags=re.M) if c.strip()]
    assert len(cells) >= 1
    shell = InteractiveShell.instance()
    try:
        for cell in cells:
            result = shell.run_cell(cell, store_history=True)
            assert result.success, f"{cell}\n{result.error_before_exec or result.error_in_exec!r}"
    finally:
        shell.run_cell("%tidyjax auto off", store_history=False)
        tj.dispose([v for v in list(shell.user_ns.values()) if isinstance(v, tj.Tensor)])
        shell.reset(new_session=False)  # drops the names and the output history
        gc.collect()


def run_block(block: Block, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run one ```python block by the rules in this module's docstring."""
    if block.marker == "no-run":
        pytest.skip(f"not run ({block.id}): {block.reason}")
    if "# was: @jax.jit" in block.code and not BIND_CONVERSION:
        pytest.skip("the standard step under tidyjax.jit needs JAX 0.10.2+ (the page says so)")
    monkeypatch.chdir(tmp_path)
    if block.marker == "ipython":
        _run_cells(block.code)
    else:
        namespace = {"__name__": "readme"}
        try:
            exec(compile(block.code, str(block.page), "exec"), namespace)
        finally:
            namespace.clear()  # a failed example's Tensors die here, not in the next test


GUIDE_BLOCKS = python_blocks(GUIDES)


@pytest.mark.parametrize("block", GUIDE_BLOCKS, ids=[b.id for b in GUIDE_BLOCKS])
def test_guide_example_runs(block, tmp_path, monkeypatch, capsys):
    run_block(block, tmp_path, monkeypatch)
    capsys.readouterr()


def test_every_block_is_fenced_with_a_known_language_and_markers_are_well_formed():
    for page in PAGES:
        for block in blocks(page):
            assert block.lang in LANGUAGES, (
                f"{block.id}: ```{block.lang} (python, text, bash, diff)"
            )
            if block.marker == "no-run":
                assert block.lang == "python" and block.reason, f"{block.id}: no-run needs a reason"
            if block.marker == "ipython":
                assert block.lang == "python" and block.code.startswith("# In["), block.id
        text = page.read_text(encoding="utf-8")
        # A marker must sit right above a block, or it silently does nothing.
        marked = {b.line for b in blocks(page) if b.marker}
        for number, line in enumerate(text.splitlines(), 1):
            if MARKER.search(line):
                assert number + 2 in marked, f"{page.name}:{number}: marker not above a block"


def test_few_blocks_are_left_unrun():
    unrun = [b.id for b in python_blocks(PAGES) if b.marker == "no-run"]
    assert len(unrun) <= MOST_UNRUN, unrun
    assert len(python_blocks(GUIDES)) >= 15


# -- links -----------------------------------------------------------------------------------

INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\]\(([^)\s]+)\)")
HTML_LINK = re.compile(r'(?:src|srcset|href)="([^"]+)"')
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", re.M)


def _prose(text: str) -> str:
    """The text without its code blocks and inline code (which may look like links)."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"[^\w\- ]", "", text.lower())  # code marks and punctuation go
    return text.replace(" ", "-")


def mkdocs_slug(heading: str) -> str:
    """The anchor MkDocs (Python-Markdown's toc) gives a heading."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"`([^`]*)`", r"\1", text).replace("**", "")
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(page: pathlib.Path) -> set[str]:
    return {github_slug(h) for h in HEADING.findall(FENCE.sub("", page.read_text()))}


def test_every_heading_has_one_anchor_on_github_and_on_the_site():
    for page in PAGES:
        headings = HEADING.findall(FENCE.sub("", page.read_text(encoding="utf-8")))
        for heading in headings:
            assert github_slug(heading) == mkdocs_slug(heading), f"{page.name}: {heading!r}"
        slugs = [github_slug(h) for h in headings]
        assert len(slugs) == len(set(slugs)), f"{page.name}: two headings share an anchor"


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_relative_link_leads_to_a_file_and_heading_that_exist(page):
    text = _prose(page.read_text(encoding="utf-8"))
    targets = LINK.findall(text) + HTML_LINK.findall(text)
    for target in targets:
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        where = (page.parent / path).resolve() if path else page
        assert where.is_file(), f"{page.name}: {target} does not exist"
        if page.parent == DOCS:  # the site holds docs/ only
            assert where.is_relative_to(DOCS), f"{page.name}: {target} is outside docs/"
        if anchor and where.suffix == ".md":
            assert anchor in anchors(where), f"{page.name}: no heading #{anchor} in {where.name}"


def test_the_readme_links_every_guide_and_the_site_lists_every_page():
    readme = README.read_text(encoding="utf-8")
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for page in GUIDES:
        assert re.search(rf":\s+{re.escape(page.name)}$", nav, re.M), f"{page.name} not in the nav"
        if page.name != "index.md":
            assert f"(docs/{page.name})" in readme, f"the README does not link {page.name}"
        assert "--8<--" not in page.read_text(), f"{page.name} includes README text again"


def test_the_api_page_repeats_the_readmes_api_table():
    def table(text: str) -> list[str]:
        rows = [line for line in text.splitlines() if line.startswith("| ")]
        return rows[: next(i for i, r in enumerate(rows) if r.startswith("| errors")) + 1]

    readme = README.read_text(encoding="utf-8")
    readme_table = readme.split("<!-- --8<-- [start:api] -->")[1].split("<!-- --8<-- [end:")[0]
    api = (DOCS / "api.md").read_text(encoding="utf-8").split("## At a glance")[1]
    assert table(api) == table(readme_table)
