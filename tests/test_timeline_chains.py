"""The timeline's sites are chains of user frames, as the leak reports' and snapshots' are: one
line reached through two callers is two sites, each with its own bytes, named outer to inner
(``a.py:54 in f → b.py:154 in g``, at most 8 frames, the middle elided) in the events,
``top_sites``, the page and the Chrome trace; a runner's frame (pytest's) ends a chain. Files
are format version 2 (each site's chain); a version-1 file loads, each site a chain of one
frame."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tidyjax as tj
from tidyjax import _timeline_format
from tidyjax.__main__ import main as cli
from tidyjax._sites import CHAIN_FRAMES

from .test_timeline import page_data

with open(__file__, encoding="utf-8") as _f:
    SOURCE = _f.read()


def _line(marker: str) -> int:
    """The line of this file that ends with the comment ``# marker``."""
    lines = SOURCE.splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.rstrip().endswith(f"# {marker}"))


def _at(marker: str, function: str) -> str:
    """The frame at ``marker``'s line in ``function``, as a label shows it."""
    return str(tj.Site(__file__, _line(marker), function))


def _make(n: int) -> tj.Tensor:
    return tj.tensor(np.ones(n, np.float32))  # chains: make


def _via_f() -> tj.Tensor:
    return _make(256)  # chains: f


def _via_g() -> tj.Tensor:
    return _make(512)  # chains: g


def _plain(n: int) -> jax.Array:
    return jnp.ones(n, jnp.float32)  # chains: plain


def _plain_f() -> jax.Array:
    return _plain(64)  # chains: plain f


def _plain_g() -> jax.Array:
    return _plain(128)  # chains: plain g


def _deep(n: int) -> tj.Tensor:
    return _make(1024) if n == 0 else _deep(n - 1)  # chains: deep


def _allocs(tl: tj.Timeline) -> list[tj.TimelineEvent]:
    return [ev for ev in tl.events if ev.kind == "alloc"]


def _two_chains() -> tuple[tj.Timeline, list[tj.Tensor]]:
    """A timeline of two Tensors made at one line (``_make``'s) through two callers."""
    with tj.timeline(sample=None) as tl:
        a = _via_f()  # chains: two f
        b = _via_g()  # chains: two g
    return tl, [a, b]


MAKE = _at("chains: make", "_make")
#: The inner ends of `_two_chains`' chains; the test's own line, which called it, comes first.
F_END = [_at("chains: two f", "_two_chains"), _at("chains: f", "_via_f"), MAKE]
G_END = [_at("chains: two g", "_two_chains"), _at("chains: g", "_via_g"), MAKE]


def _labels(marker: str, test: str) -> tuple[str, str]:
    """The labels of `_two_chains`' two sites, called from ``test`` at its line marked
    ``# calls: marker``."""
    outer = _at(f"calls: {marker}", test)
    return " → ".join([outer, *F_END]), " → ".join([outer, *G_END])


def test_one_line_reached_through_two_callers_is_two_sites_outer_to_inner():
    test = "test_one_line_reached_through_two_callers_is_two_sites_outer_to_inner"
    tl, ts = _two_chains()  # calls: two sites
    f, g = _labels("two sites", test)
    a, b = _allocs(tl)
    assert (a.bytes, b.bytes) == (1024, 2048)
    assert (a.site.line, a.site.function) == (b.site.line, b.site.function)  # one line
    assert a.site != b.site  # two chains
    assert a.site.label == f and b.site.label == g
    # outer (this test's line) to inner (the line that made it)
    assert [str(x) for x in a.site.frames] == [_at("calls: two sites", test), *F_END]
    assert str(a.site) == MAKE  # the site's own frame: the inner end
    top = tl.top_sites()
    assert [(s.label, s.count, s.bytes) for s in top] == [(g, 1, 2048), (f, 1, 1024)]
    assert top[0].shapes == {"float32[512]": 1} and top[1].shapes == {"float32[256]": 1}
    tj.dispose(ts)


def test_plain_arrays_are_sited_by_their_chains_too():
    with tj.timeline(sample=None) as tl:
        x = _plain_f()  # chains: plain test f
        y = _plain_g()  # chains: plain test g
        tl.mark()
    test = "test_plain_arrays_are_sited_by_their_chains_too"
    inner = _at("chains: plain", "_plain")
    f = " → ".join([_at("chains: plain test f", test), _at("chains: plain f", "_plain_f"), inner])
    g = " → ".join([_at("chains: plain test g", test), _at("chains: plain g", "_plain_g"), inner])
    untracked = [(s.site.label, s.bytes) for s in tl.top_sites() if s.untracked]
    assert untracked == [(g, 512), (f, 256)]
    del x, y


def test_library_frames_between_user_frames_are_left_out():
    with tj.timeline(sample=None) as tl:
        (t,) = jax.tree.map(_make, [128])  # chains: through tree.map
    (ev,) = _allocs(tl)
    test = "test_library_frames_between_user_frames_are_left_out"
    assert ev.site.label == f"{_at('chains: through tree.map', test)} → {MAKE}"
    t.dispose()


def test_a_chain_beyond_8_frames_is_elided_in_the_middle_and_kept_whole():
    with tj.timeline(sample=None) as tl:
        t = _deep(10)  # chains: deep test
    (ev,) = _allocs(tl)
    test = "test_a_chain_beyond_8_frames_is_elided_in_the_middle_and_kept_whole"
    frames = [_at("chains: deep test", test), *[_at("chains: deep", "_deep")] * 11, MAKE]
    assert [str(f) for f in ev.site.frames] == frames  # the chain whole: 13 frames
    half = CHAIN_FRAMES // 2
    assert CHAIN_FRAMES == 8
    assert ev.site.label.split(" → ") == [*frames[:half], "…", *frames[-half:]]
    t.dispose()


def _make_then_fail(out: list[tj.Tensor]) -> None:
    out.append(_make(64))  # chains: made under pytest.raises
    raise ZeroDivisionError


def test_a_runner_frame_ends_the_chain():
    out: list[tj.Tensor] = []
    with tj.timeline(sample=None) as tl:
        # pytest.raises calls the function itself: a runner's frame (pytest's) lies between
        # this test's frame and the function's, and the chain ends there
        pytest.raises(ZeroDivisionError, _make_then_fail, out)  # noqa: RUF061 (pytest calls it)
    (ev,) = _allocs(tl)
    made = _at("chains: made under pytest.raises", "_make_then_fail")
    assert ev.site.label == f"{made} → {MAKE}"
    assert "test_a_runner_frame_ends_the_chain" not in ev.site.label
    tj.dispose(out)


def test_the_outermost_frame_is_the_test_not_pytest():
    tl, ts = _two_chains()  # calls: outermost
    for ev in _allocs(tl):
        outer = ev.site.frames[0]
        assert str(outer) == _at(
            "calls: outermost", "test_the_outermost_frame_is_the_test_not_pytest"
        )
        assert all("pytest" not in f.file for f in ev.site.frames)
    tj.dispose(ts)


def test_save_and_load_keep_the_chains(tmp_path):
    tl, ts = _two_chains()  # calls: save
    path = tmp_path / "t.json"
    tl.dump(path)
    data = json.loads(path.read_text(encoding="utf-8"))
    assert (data["format"], data["version"]) == ("tidyjax.timeline", 2)
    frames = [tuple(f) for f in data["frames"]]
    assert len(frames) == len(set(frames))  # each frame once, the sites' rows index them
    for own, detail, chain in data["sites"]:
        assert detail == -1 and [frames[i][2] for i in chain][-1] == frames[own][2] == "_make"
    back = tj.Timeline.load(path)
    assert back.events == tl.events  # Site equality includes the chain
    labels = _labels("save", "test_save_and_load_keep_the_chains")
    assert tuple(ev.site.label for ev in _allocs(back)) == labels
    assert [s.label for s in back.top_sites()] == [s.label for s in tl.top_sites()]
    assert back._stacks == tl._stacks  # each chain's short stacks
    tj.dispose(ts)


def _as_version_1(data: dict) -> dict:
    """``data`` (a version-2 timeline) written as version 1 wrote it: a site row is its own
    frame's ``file, line, function``, then its library frame's (none here), and no frames."""
    old = json.loads(json.dumps(data))
    frames = old.pop("frames")
    old["sites"] = [
        [x for i in (own, *([detail] if detail >= 0 else [])) for x in frames[i]]
        for own, detail, _ in old["sites"]
    ]
    old["version"] = 1
    return old


def test_a_version_1_file_loads_each_site_a_chain_of_one_frame(tmp_path):
    tl, ts = _two_chains()
    tj.dispose(ts)
    old = _as_version_1(tl.to_json())
    # a row per chain, each its own frame alone: the same line twice
    assert old["sites"] == [[__file__, _line("chains: make"), "_make"]] * 2
    library = ["/lib/flax/nnx/module.py", 7, "__call__"]
    old["sites"].append(["/a/b.py", 3, "f", *library])  # a site with its library frame
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old), encoding="utf-8")
    back = tj.Timeline.load(path)
    a, b = _allocs(back)
    assert a.site == b.site == tj.Site(__file__, _line("chains: make"), "_make")
    assert a.site.chain == () and a.site.label == MAKE
    # one site now: the two chains' bytes together
    assert [(s.label, s.count, s.bytes) for s in back.top_sites()] == [(MAKE, 2, 3072)]
    assert back.events[0].time == tl.events[0].time and back.peak_bytes == tl.peak_bytes
    # the last row, no event's: its library frame read as the detail
    codec = _timeline_format.Codec.read(old)
    assert codec.site_list[2] == tj.Site("/a/b.py", 3, "f") and codec.site_list[2].chain == ()
    assert codec.site_list[2].detail == tj.Site(*library)
    assert MAKE.replace("<", "&lt;") in back.to_html()
    assert cli(["view", str(path), "-o", str(tmp_path / "old.html")]) == 0  # the command line
    # written again, it is version 2
    assert back.to_json()["version"] == 2


def test_the_page_and_the_chrome_trace_show_the_chain(tmp_path):
    tl, ts = _two_chains()  # calls: page
    f, g = _labels("page", "test_the_page_and_the_chrome_trace_show_the_chain")
    page = tl.to_html()
    sites = page_data(page)["sites"]  # the legend's and the hover's
    assert sorted(site["label"] for site in sites) == sorted([f, g])
    stacks = {site["label"]: site["stack"] for site in sites}
    assert stacks[f][0] == MAKE  # the hover's stack: the innermost frame first
    escaped = g.replace("<", "&lt;").replace(">", "&gt;")
    assert f"By site, largest first: {escaped} (2.0 KiB)" in page  # the line under the chart
    table = page[page.index('<table class="tj-peak-table"') :]
    assert f'<td class="tj-site" style="text-align:left">{escaped}</td>' in table
    tl.to_chrome_trace(tmp_path / "t.trace.json")
    trace = json.loads((tmp_path / "t.trace.json").read_text(encoding="utf-8"))
    sites = [ev["args"]["site"] for ev in trace["traceEvents"] if ev.get("cat") == "alloc"]
    assert sites == [f, g]
    tj.dispose(ts)
