"""Exploring the timeline page in headless Chromium: zoom and pan, the legend, the scope bands,
the tooltip and its stack, and pictures that say what happened (steps, the compile, Variables by
name, a snapshot as one moment, per-device numbers, readable text at 700 px).

One browser for the module (``driver`` from test_timeline_browser); the timelines are small or
built with the plain API (a 10,000-step run takes a fraction of a second).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import tidyjax as tj
from tidyjax import _timeline as tlm
from tidyjax import tidy

from . import test_timeline_browser as _browser
from .test_timeline import page_data
from .test_timeline_browser import _errors, _open

driver = _browser.driver  # its module-scoped fixture: one browser for this module too

selenium = pytest.importorskip("selenium", reason="pip install selenium (the test extra)")
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.actions.wheel_input import ScrollOrigin  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402

MiB = 1024 * 1024
PARAMS = tj.Site("train.py", 5, "init")
ACT = tj.Site("train.py", 20, "forward")
GRAD = tj.Site("train.py", 30, "backward")
EVAL = tj.Site("train.py", 50, "evaluate")


def training(steps: int, compile_s: float = 0.0) -> tlm.Timeline:
    """A run recorded through the plain API: 1 MiB of parameters made first and kept, then
    ``steps`` scopes "train/step" of small activations and gradients (each made and freed in
    its step), then one scope "evaluate" holding 6 MiB: the peak, one step long. The first step
    takes ``compile_s`` longer (its compile)."""
    tl = tlm.Timeline(max_events=10 * steps + 100)
    tl._loaded = True  # made of TimelineEvents, as a loaded one
    tl.start_time, tl.started_at = 0.0, 0.0
    t, number = 0.0, 0

    def add(kind: str, site: tj.Site | None = None, nbytes: int = 0, scope: str = "",
            name: str = "", buffer: int = 0) -> int:  # fmt: skip
        nonlocal t, number
        t += 1e-4
        if site is None:
            ev = tlm.TimelineEvent(kind, t, 0, "", None, scope, (), "", (), buffer, name)
            tl._append(ev, 0)
            return buffer
        if kind == "alloc":
            number += 1
            buffer = number
        ev = tlm.TimelineEvent(kind, t, nbytes, "cpu:0", site, scope, (nbytes // 4,), "float32",
                               (), buffer, "", (("cpu:0", nbytes),))  # fmt: skip
        tl._append(ev, nbytes if kind == "alloc" else -nbytes)
        return buffer

    add("alloc", PARAMS, MiB)
    scope = 0
    for i in range(steps):
        scope += 1
        add("scope_enter", scope="train/step", name="step", buffer=scope)
        if i == 0:
            t += compile_s
        a = add("alloc", ACT, 64 * 1024, "train/step")
        b = add("alloc", ACT, 64 * 1024, "train/step")
        g = add("alloc", GRAD, 32 * 1024, "train/step")
        for buf, nbytes, site in ((a, 65536, ACT), (b, 65536, ACT), (g, 32768, GRAD)):
            add("free", site, nbytes, "train/step", buffer=buf)
        add("scope_exit", scope="train/step", name="step", buffer=scope)
    scope += 1
    add("scope_enter", scope="evaluate", name="evaluate", buffer=scope)
    e = add("alloc", EVAL, 6 * MiB, "evaluate")
    add("free", EVAL, 6 * MiB, "evaluate", buffer=e)
    add("scope_exit", scope="evaluate", name="evaluate", buffer=scope)
    return tl


@pytest.fixture(scope="module")
def long_run(tmp_path_factory):
    path = tmp_path_factory.mktemp("explore") / "long.html"
    training(10_000, compile_s=2.0).save_html(path)
    return path


def _area(svg, label: str):
    return next(
        a
        for a in svg.find_elements(By.CSS_SELECTOR, ".tj-area")
        if a.get_attribute("data-label") == label
    )


def _box_width(driver, element) -> float:
    """How wide ``element``, a stacked area, is drawn with some height (in px): its path is the
    upper edge left to right, then the lower edge right to left, as steps."""
    tokens = re.findall(r"[MHVZ]|[\d.]+", element.get_attribute("d"))
    points, x, y, i = [], 0.0, 0.0, 0
    while i < len(tokens):
        op = tokens[i]
        if op == "M":
            x, y, i = float(tokens[i + 1]), float(tokens[i + 2]), i + 3
        elif op == "H":
            x, i = float(tokens[i + 1]), i + 2
        elif op == "V":
            y, i = float(tokens[i + 1]), i + 2
        else:
            i += 1
            continue
        points.append((x, y))
    right = max(p[0] for p in points)
    turn = next(k for k, p in enumerate(points) if p[0] == right)
    upper, lower = points[: turn + 1], points[turn + 1 :][::-1]

    def at(edge: list[tuple[float, float]], px: float) -> float:
        found = edge[0][1]
        for ex, ey in edge:  # the step's height where it starts at or before px
            if ex <= px:
                found = ey
        return found

    left = min(p[0] for p in points)
    return float(sum(1 for px in range(int(left), int(right)) if at(lower, px + 0.5)
                     - at(upper, px + 0.5) > 0.5))  # fmt: skip


def _range(driver) -> str:
    return driver.find_element(By.CSS_SELECTOR, ".tj-range").text


def test_the_peak_shows_at_first_paint_of_10000_steps(driver, long_run):
    svg = _open(driver, long_run, "light")
    assert _errors(driver) == []
    assert _range(driver) == "the whole run"
    # the evaluate phase is 4 of 80,005 events, and still drawn wide enough to see
    assert _box_width(driver, _area(svg, str(EVAL))) >= 12
    label = svg.find_element(By.CSS_SELECTOR, ".tj-peak text")
    assert label.text == "peak 7.0 MiB"
    line = svg.find_element(By.CSS_SELECTOR, ".tj-peak line")
    # the label is above the plot, clear of the line
    lbox = driver.execute_script("return arguments[0].getBBox()", label)
    x = float(line.get_attribute("x1"))
    assert not lbox["x"] <= x <= lbox["x"] + lbox["width"]
    assert lbox["y"] + lbox["height"] <= float(line.get_attribute("y1"))
    # the axis counts steps: the steps are scopes ("train/step" 10,000 times)
    ticks = [t.text for t in svg.find_elements(By.CSS_SELECTOR, ".tj-tick")]
    assert "step 1" in ticks and any(re.fullmatch(r"step \d+000", t) for t in ticks)
    sub = driver.find_element(By.CSS_SELECTOR, ".tj-sub").text
    assert "ticks at steps (scope train/step)" in sub
    assert "step 1 took 2.00 s, the first call (compile)" in sub
    names = [b.get_attribute("data-name") for b in svg.find_elements(By.CSS_SELECTOR, ".tj-band")]
    assert names[0] == "first call (compile)" and "evaluate" in names


def test_a_band_click_zooms_to_its_scope_and_reaggregates(driver, long_run):
    svg = _open(driver, long_run, "light")
    before = _box_width(driver, _area(svg, str(EVAL)))
    band = next(
        b for b in svg.find_elements(By.CSS_SELECTOR, ".tj-band")
        if b.get_attribute("data-name") == "evaluate"
    )  # fmt: skip
    band.find_element(By.TAG_NAME, "rect").click()
    svg = driver.find_element(By.CSS_SELECTOR, ".tj-chart:not([hidden]) svg.tj-live")
    assert re.fullmatch(r"events 80,00\d\u201380,005 of 80,005", _range(driver))
    plot = float(svg.find_element(By.CSS_SELECTOR, ".tj-hit").get_attribute("width"))
    evaluate = next(
        b for b in svg.find_elements(By.CSS_SELECTOR, ".tj-band")
        if b.get_attribute("data-name") == "evaluate"
    )  # fmt: skip
    assert evaluate.find_element(By.TAG_NAME, "rect").rect["width"] > 0.7 * plot
    after = _box_width(driver, _area(svg, str(EVAL)))
    assert after > 0.2 * plot and after > 10 * before  # one step, now a third of the chart
    # the y axis is re-scaled to what shows: still 7 MiB at the top here
    assert svg.find_element(By.CSS_SELECTOR, ".tj-peak text").text == "peak 7.0 MiB"
    driver.find_element(By.CSS_SELECTOR, ".tj-reset").click()
    assert _range(driver) == "the whole run"
    assert _errors(driver) == []


def test_the_wheel_zooms_and_a_drag_pans(driver, long_run):
    svg = _open(driver, long_run, "light")
    plot, box = svg.find_element(By.CSS_SELECTOR, ".tj-hit").rect, svg.rect
    dx = plot["x"] + plot["width"] / 2 - (box["x"] + box["width"] / 2)
    dy = plot["y"] + plot["height"] / 2 - (box["y"] + box["height"] / 2)
    origin = ScrollOrigin.from_element(svg, int(dx), int(dy))  # the middle of the plot
    for _ in range(6):  # the chart is drawn anew at each step: the svg element stays
        ActionChains(driver).scroll_from_origin(origin, 0, -400).perform()
    shown = _range(driver)
    m = re.fullmatch(r"events ([\d,]+)\u2013([\d,]+) of 80,005", shown)
    assert m, shown
    lo, hi = (int(x.replace(",", "")) for x in m.groups())
    assert 0 < lo < 40_000 < hi < 80_005 and hi - lo < 10_000  # around the middle, zoomed in
    ticks = [t.text for t in svg.find_elements(By.CSS_SELECTOR, ".tj-tick") if "step" in t.text]
    steps = [int(t.split()[1]) for t in ticks]
    assert steps and all(lo / 8 - 2 <= s <= hi / 8 + 2 for s in steps)  # 8 events a step
    ActionChains(driver).scroll_from_origin(origin, 300, 0).perform()  # sideways: pans
    swiped = re.fullmatch(r"events ([\d,]+)\u2013([\d,]+) of 80,005", _range(driver))
    assert swiped and int(swiped.group(1).replace(",", "")) > lo  # later events
    lo = int(swiped.group(1).replace(",", ""))
    ActionChains(driver).move_to_element_with_offset(svg, int(dx), int(dy)).click_and_hold(
    ).move_by_offset(200, 0).release().perform()  # fmt: skip
    m2 = re.fullmatch(r"events ([\d,]+)\u2013([\d,]+) of 80,005", _range(driver))
    assert m2 and int(m2.group(1).replace(",", "")) < lo  # dragged right: earlier events
    assert _errors(driver) == []


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    path = tmp_path_factory.mktemp("explore") / "small.html"
    training(20).save_html(path)
    return path


def test_a_legend_click_isolates_its_site(driver, small_run):
    svg = _open(driver, small_run, "light")
    items = driver.find_elements(By.CSS_SELECTOR, ".tj-legend li")
    assert [i.text for i in items][:1] == [str(PARAMS)]  # held all along: the bottom
    target = next(i for i in items if i.text == str(GRAD))
    target.click()
    assert target.get_attribute("aria-pressed") == "true"
    opacity = {
        a.get_attribute("data-label"): float(a.value_of_css_property("fill-opacity"))
        for a in svg.find_elements(By.CSS_SELECTOR, ".tj-area")
    }
    assert opacity[str(GRAD)] > 0.8
    assert all(v < 0.2 for k, v in opacity.items() if k != str(GRAD))
    target.click()  # again: every site
    assert all(
        float(a.value_of_css_property("fill-opacity")) > 0.8
        for a in svg.find_elements(By.CSS_SELECTOR, ".tj-area")
    )
    assert _errors(driver) == []


def _hover_bottom(driver, svg, frac: float = 0.5):
    """Point at the bottom layer, ``frac`` of the way across the plot."""
    plot = svg.find_element(By.CSS_SELECTOR, ".tj-hit")
    w, h = plot.rect["width"], plot.rect["height"]
    ActionChains(driver).move_to_element_with_offset(plot, int(w * (frac - 0.5)), int(h / 2 - 3)
                                                     ).perform()  # fmt: skip
    return driver.find_element(By.CSS_SELECTOR, ".tj-tip")


def test_the_tooltip_says_live_now_and_over_the_run_and_a_click_keeps_it(driver, small_run):
    svg = _open(driver, small_run, "light")
    tip = _hover_bottom(driver, svg, 0.4)
    assert tip.is_displayed()
    lines = tip.text.splitlines()
    assert lines[0] == str(PARAMS)
    assert re.fullmatch(r"1\.0 MiB live now, of 1\.\d+ MiB live on cpu:0, at \+[\d.]+ ms "
                        r"\(step \d+\)", lines[1])  # fmt: skip
    assert lines[2] == "allocations over the run: 1 (float32[262144])"
    assert lines[-1] == "click to keep these details"
    ActionChains(driver).click().perform()
    assert tip.text.splitlines()[-1] == "kept: click elsewhere to let go"
    ActionChains(driver).move_by_offset(0, -60).perform()  # elsewhere on the chart: it stays
    assert tip.is_displayed() and tip.text.splitlines()[0] == str(PARAMS)
    driver.find_element(By.CSS_SELECTOR, ".tj-sub").click()  # off the chart: let go
    assert not tip.is_displayed()
    assert _errors(driver) == []


def _made_here(n: int) -> list[tj.Tensor]:
    return [tj.tensor(np.ones(256 * (i + 1), np.float32)) for i in range(n)]


def test_a_site_shows_its_stack_on_hover_and_saves_it(driver, tmp_path):
    with tj.timeline() as tl:
        ts = tidy.run("make", _made_here, 2)
    tj.dispose(ts)
    (site,) = tl._stacks
    frames = [f.function for f in tl._stacks[site][0]]
    assert frames[0].endswith("<listcomp>") or frames[0] == "_made_here"  # by Python's version
    assert "_made_here" in frames and len(frames) == 4
    # saved and loaded with the timeline
    tl.dump(tmp_path / "t.json")
    assert tj.Timeline.load(tmp_path / "t.json")._stacks == tl._stacks
    path = tmp_path / "stack.html"
    tl.save_html(path)
    svg = _open(driver, path, "light")
    tip = _hover_bottom(driver, svg, 0.7)
    lines = tip.text.splitlines()
    at = lines.index("stack (innermost first):")
    assert "test_timeline_explore.py:" in lines[at + 1] and "_made_here" in "".join(lines[at:])
    frame = tip.find_element(By.CSS_SELECTOR, ".tj-frame")
    assert frame.value_of_css_property("word-break") != "break-all"
    assert _errors(driver) == []


def test_variables_are_labelled_by_name(driver, tmp_path):
    w = tj.Variable(tj.tensor(np.ones((16, 16), np.float32)), name="w0")
    b = tj.Variable(tj.tensor(np.zeros(16, np.float32)), name="b0")
    with tj.timeline() as tl:
        for _ in range(3):
            with tidy("step"):
                w.assign(w * 0.5)  # one line for both: not what the chart names
                b.assign(b + 1.0)
    tj.dispose_variables()
    path = tmp_path / "vars.html"
    tl.save_html(path)
    _open(driver, path, "light")
    legend = [li.text for li in driver.find_elements(By.CSS_SELECTOR, ".tj-legend li")]
    assert "Variable 'w0'" in legend and "Variable 'b0'" in legend
    assert not any("test_variables_are_labelled_by_name" in x for x in legend), legend
    # the names survive a dump and a load
    tl.dump(tmp_path / "vars.json")
    page = tj.Timeline.load(tmp_path / "vars.json").to_html()
    assert "Variable &#x27;w0&#x27;" in page or "Variable 'w0'" in page
    assert _errors(driver) == []


def test_a_snapshot_is_one_moment(driver, tmp_path):
    ts = _made_here(4)
    tl = tj.Timeline.from_snapshot(tj.snapshot())
    tj.dispose(ts)
    path = tmp_path / "snap.html"
    tl.save_html(path)
    svg = _open(driver, path, "light")
    xs = set()
    for a in svg.find_elements(By.CSS_SELECTOR, ".tj-area"):
        xs |= {round(float(x)) for x in re.findall(r"[MH]([\d.]+)", a.get_attribute("d"))}
    assert len(xs) == 2  # one column: the plot's two edges, no staircase
    assert [
        t.text for t in svg.find_elements(By.CSS_SELECTOR, ".tj-tick") if "moment" in t.text
    ] == ["one moment (a snapshot)"]
    assert not svg.find_elements(By.CSS_SELECTOR, ".tj-peak")
    assert driver.find_element(By.CSS_SELECTOR, ".tj-sub").text.startswith(
        "a snapshot: 4 buffers at one moment"
    )
    caption = driver.find_element(By.CSS_SELECTOR, ".tj-peak-table caption").text
    assert caption == "Alive in the snapshot, largest first"
    assert _errors(driver) == []


_SIZES = """
var out=[];
document.querySelectorAll('.tjtl *').forEach(function(e){
  if(!e.offsetParent&&!(e instanceof SVGElement))return;
  var own=[].some.call(e.childNodes,function(n){return n.nodeType===3&&n.textContent.trim()});
  if(!own)return;
  var px=parseFloat(getComputedStyle(e).fontSize);
  var svg=e.ownerSVGElement;
  if(svg){var r=e.getBoundingClientRect();if(!r.width)return;px*=svg.getScreenCTM().a}
  out.push([px,e.textContent.slice(0,30),getComputedStyle(e).wordBreak]);
});
return out;
"""


def test_no_text_under_10px_at_700px_and_no_break_all(driver, small_run):
    size = driver.get_window_size()
    driver.set_window_size(700 + 32, size["height"])
    try:
        _open(driver, small_run, "light")
        _hover_bottom(driver, driver.find_element(By.CSS_SELECTOR, "svg.tj-live"))
        sizes = driver.execute_script(_SIZES)
        assert len(sizes) > 20
        small = [s for s in sizes if s[0] < 10]
        assert small == []
        assert [s for s in sizes if s[2] == "break-all"] == []
    finally:
        driver.set_window_size(size["width"], size["height"])


def _sharded() -> tlm.Timeline:
    """Two devices: a 2 MiB buffer sharded over both (1 MiB each), then 512 KiB on gpu:1."""
    tl = tlm.Timeline()
    tl._loaded = True  # made of TimelineEvents, as a loaded one
    tl.start_time = 0.0
    pairs = ((("gpu:0", MiB), ("gpu:1", MiB)), (("gpu:1", MiB // 2),))
    for i, pd in enumerate(pairs):
        nbytes = sum(b for _, b in pd)
        ev = tlm.TimelineEvent("alloc", i * 1e-3, nbytes, ",".join(d for d, _ in pd), ACT, "",
                               (nbytes // 4,), "float32", (i + 1,), i + 1, "", pd)  # fmt: skip
        tl._append(ev, nbytes)
    return tl


def test_several_devices_give_per_device_numbers(driver, tmp_path):
    path = tmp_path / "devices.html"
    _sharded().save_html(path)
    _open(driver, path, "light")
    sub = driver.find_element(By.CSS_SELECTOR, ".tj-sub").text
    assert "peak per device 1.0 MiB\u20131.5 MiB (2.5 MiB over 2 devices together)" in sub
    tables = driver.find_elements(By.CSS_SELECTOR, ".tj-peak-table")
    shown = [t for t in tables if t.is_displayed()]
    assert len(tables) == 2 and len(shown) == 1  # gpu:1, the larger peak, first
    cells = [td.text for td in shown[0].find_elements(By.CSS_SELECTOR, "tbody tr td")]
    assert cells[0] == "1.0 MiB" and cells[5] == "gpu:1"  # the shard's bytes, not 2 MiB
    assert "gpu:1's peak (1.5 MiB)" in shown[0].find_element(By.TAG_NAME, "caption").text
    buttons = driver.find_elements(By.CSS_SELECTOR, ".tj-devices button")
    assert len({b.rect["y"] for b in buttons}) == 1  # one row
    buttons[0].click()
    shown = [t for t in tables if t.is_displayed()]
    assert [td.text for td in shown[0].find_elements(By.CSS_SELECTOR, "td")][:1] == ["1.0 MiB"]
    assert "gpu:0's peak (1.0 MiB)" in shown[0].find_element(By.TAG_NAME, "caption").text
    assert _errors(driver) == []


def test_long_lived_sites_are_stacked_at_the_bottom():
    sites = page_data(training(30).to_html())["sites"]  # the script's series, bottom up
    assert [site["label"] for site in sites] == [str(PARAMS), str(ACT), str(GRAD), str(EVAL)]


def test_the_static_chart_stays_for_pages_without_scripts():
    page = training(30).to_html()
    assert page.count('<img class="tj-static"') == 1  # what sanitizers keep
    assert '<script type="application/json" class="tj-data">' in page


def test_older_files_without_stacks_or_names_load(tmp_path):
    data = training(3).to_json()
    del data["stacks"], data["names"]
    back = tj.Timeline.from_json(data)
    assert back._stacks == {} and back._names == {}
    assert "<svg" in back.to_html() or "tj-static" in back.to_html()


def test_only_a_snapshot_is_one_moment():
    with tj.timeline() as tl:
        (t,) = _made_here(1)
    tj.dispose(t)
    assert len(tl.events) == 1
    assert '<p class="tj-sub">a snapshot' not in tl.to_html()
    (t,) = _made_here(1)
    snap = tj.Timeline.from_snapshot(tj.snapshot())
    tj.dispose(t)
    assert '<p class="tj-sub">a snapshot: 1 buffer at one moment' in snap.to_html()


def test_a_mark_is_a_labelled_line_and_the_table_can_show_its_moment(driver, tmp_path):
    tl = training(30)
    (enter,) = [ev for ev in tl.events if ev.kind == "scope_enter" and ev.scope == "evaluate"]
    tl._marks.append(tlm.Mark(enter.time, "evaluation", 6 * MiB))
    path = tmp_path / "marked.html"
    tl.save_html(path, at="evaluation")
    page = path.read_text(encoding="utf-8")
    assert "Alive at \u201cevaluation (6.0 MiB)\u201d (+" in page  # the table at the mark
    assert "1.0 MiB in 1 buffer" in page and "came later)" in page  # the 6 MiB came after it
    svg = _open(driver, path, "dark")
    assert _errors(driver) == []
    (mark,) = svg.find_elements(By.CSS_SELECTOR, ".tj-mark")
    assert mark.get_attribute("data-label") == "evaluation"
    assert mark.find_element(By.TAG_NAME, "text").text == "evaluation (6.0 MiB)"
    line = mark.find_element(By.TAG_NAME, "line")
    x = float(line.get_attribute("x1"))
    band = next(
        b for b in svg.find_elements(By.CSS_SELECTOR, ".tj-band")
        if b.get_attribute("data-name") == "evaluate"
    )  # fmt: skip
    rect = band.find_element(By.TAG_NAME, "rect")
    x0 = float(rect.get_attribute("x"))
    assert x0 <= x <= x0 + 8  # drawn where evaluate starts (just after its enter event)
    peak_x = float(svg.find_element(By.CSS_SELECTOR, ".tj-peak line").get_attribute("x1"))
    assert x < peak_x  # before the peak it preceded
    style = driver.execute_script(
        "var s=getComputedStyle(arguments[0]);return [s.stroke,s.strokeDasharray]", line
    )
    assert style[0] not in ("none", "") and style[1] != "none"  # a visible dashed line
    assert mark.find_element(By.TAG_NAME, "text").rect["width"] > 0
    rect.click()  # zoomed to evaluate's 4 events: the mark follows, after the first of them
    svg = driver.find_element(By.CSS_SELECTOR, ".tj-chart:not([hidden]) svg.tj-live")
    (mark,) = svg.find_elements(By.CSS_SELECTOR, ".tj-mark")
    rect = next(
        b for b in svg.find_elements(By.CSS_SELECTOR, ".tj-band")
        if b.get_attribute("data-name") == "evaluate"
    ).find_element(By.TAG_NAME, "rect")  # fmt: skip
    x0, width = float(rect.get_attribute("x")), float(rect.get_attribute("width"))
    x = float(mark.find_element(By.TAG_NAME, "line").get_attribute("x1"))
    assert x0 + 0.15 * width <= x <= x0 + 0.4 * width
    assert _errors(driver) == []


def test_an_unknown_mark_label_is_an_error_naming_the_marks():
    tl = training(3)
    tl._marks.append(tlm.Mark(tl.events[-1].time, "eval"))
    with pytest.raises(
        tj.TidyjaxValueError, match=r"no annotation 'evil' \(its annotations: 'eval'\)"
    ):
        tl.to_html(at="evil")


def test_the_table_at_a_mark_gives_each_devices_bytes_then():
    tl = _sharded()
    tl._marks.append(tlm.Mark(0.0005, "between"))  # after the sharded buffer, before the rest
    page = tl.to_html(at="between")
    tables = re.findall(r'<table class="tj-peak-table"([^>]*)><caption>(.*?)</caption>', page)
    assert [re.search(r'data-alive="(\d+)"', attrs).group(1) for attrs, _ in tables] == [
        str(MiB),
        str(MiB),
    ]
    assert "on gpu:1: 1.0 MiB in 1 buffer" in tables[1][1]
    assert "(the peak, 1.5 MiB at +1.0 ms, came later)" in tables[1][1]
    assert "came" not in tables[0][1]  # gpu:0 held its peak then
