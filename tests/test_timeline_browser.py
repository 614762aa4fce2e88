"""The timeline page as a reader sees it: headless Chromium, in a light and a dark scheme.

Needs Debian's ``chromium`` and ``chromium-driver`` (``apt-get install -y chromium
chromium-driver``) and selenium (the ``test`` extra); skipped with the reason otherwise.
"""

from __future__ import annotations

import gc
import io
import random
import re

import numpy as np
import pytest

import tidyjax as tj
from tidyjax import _timeline as tlm
from tidyjax import tidy

from .conftest import tensors_at_sites
from .headless import headless_chromium

selenium = pytest.importorskip("selenium", reason="pip install selenium (the test extra)")
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

SCHEMES = ["light", "dark"]
TOP = 4


@pytest.fixture(scope="module")
def driver():
    d = headless_chromium()
    yield d
    d.quit()


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """A real recording: 9 sites (the largest "model.py:9"), two scope bands, one peak. No
    sampler: on a loaded machine it may see a conversion's temporary live for two looks, a
    tenth site this picture's fixed legend does not expect."""
    with tj.timeline(sample=None) as tl:
        params = tidy.run("load_params", tensors_at_sites, 9, "model.py")
        with tidy("release"):
            tj.dispose(params[:5])
    tj.dispose(params)
    path = tmp_path_factory.mktemp("timeline") / "timeline.html"
    tl.save_html(path, top=TOP)
    return path


def _inner(label: str) -> str:
    """The inner end of a site's chain label (``a.py:5 in f → model.py:9 in <module>``)."""
    return label.rsplit(" → ", 1)[-1]


def _open(driver, path, scheme):
    driver.execute_cdp_cmd(
        "Emulation.setEmulatedMedia",
        {"features": [{"name": "prefers-color-scheme", "value": scheme}]},
    )
    driver.get(path.as_uri())
    ready = ".tjtl[data-ready]"  # the script ran (it inflates the data asynchronously)
    WebDriverWait(driver, 10).until(lambda d: d.find_elements(By.CSS_SELECTOR, ready))
    return driver.find_element(By.CSS_SELECTOR, ".tj-chart:not([hidden]) svg.tj-svg")


def _errors(driver) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def _rgb(css: str) -> tuple[float, ...]:
    return tuple(float(x) for x in re.findall(r"[\d.]+", css)[:3])


def _luminance(rgb: tuple[float, ...]) -> float:
    def lin(c: float) -> float:
        c /= 255
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (lin(c) for c in rgb)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


@pytest.mark.parametrize("scheme", SCHEMES)
def test_the_page_draws_areas_bands_peak_and_table_without_errors(driver, page, scheme):
    svg = _open(driver, page, scheme)
    assert _errors(driver) == []
    labels = [a.get_attribute("data-label") for a in svg.find_elements(By.CSS_SELECTOR, ".tj-area")]
    assert len(labels) == TOP + 1  # one area per top site, plus "other"
    # the top sites by size, stacked bottom up from the longest-lived (all four live to the end;
    # those made first lived longest), each named by its chain of user frames, outer to inner
    assert all(" in page → " in s and " in tensors_at_sites → model.py:" in s for s in labels[:-1])
    assert {_inner(s) for s in labels[:-1]} == {f"model.py:{i} in <module>" for i in (6, 7, 8, 9)}
    assert _inner(labels[0]) in ("model.py:6 in <module>", "model.py:7 in <module>")
    assert labels[-1] == "other (5 sites)"
    bands = [b.text for b in svg.find_elements(By.CSS_SELECTOR, ".tj-band text")]
    assert bands == ["load_params", "release"]
    peak = svg.find_element(By.CSS_SELECTOR, ".tj-peak text").text
    assert peak == "peak 45.0 KiB"
    first = driver.find_element(By.CSS_SELECTOR, ".tj-peak-table tbody tr")
    cells = [td.text for td in first.find_elements(By.TAG_NAME, "td")]
    assert cells[:3] == ["9.0 KiB", "1", "float32[2304]"] and cells[4] == "load_params"
    assert cells[3] in labels and _inner(cells[3]) == "model.py:9 in <module>"  # the chain


@pytest.mark.parametrize("scheme", SCHEMES)
def test_hovering_an_area_names_its_site_shapes_bytes_and_scope(driver, page, scheme):
    svg = _open(driver, page, scheme)
    line = svg.find_element(By.CSS_SELECTOR, ".tj-peak line").rect
    box = svg.rect
    # Just above the axis at the peak: the bottom layer, the longest-lived site.
    x = line["x"] - (box["x"] + box["width"] / 2)
    y = line["y"] + line["height"] - 4 - (box["y"] + box["height"] / 2)
    ActionChains(driver).move_to_element_with_offset(svg, int(x), int(y)).perform()
    tip = driver.find_element(By.CSS_SELECTOR, ".tj-tip")
    assert tip.is_displayed()
    bottom = svg.find_element(By.CSS_SELECTOR, ".tj-area").get_attribute("data-label")
    line = int(_inner(bottom).split(":")[1].split()[0])  # model.py:N holds N KiB
    lines = tip.text.splitlines()
    assert lines[0] == bottom
    assert re.fullmatch(rf"{line}\.0 KiB live now, of 45\.0 KiB live on \S+, at \+[\d.]+ (ms|s)",
                        lines[1])  # fmt: skip
    assert lines[2:5] == [
        f"allocations over the run: 1 (float32[{256 * line}])",
        "dtype: float32",
        "scopes of those allocations: load_params",
    ]
    hot = svg.find_elements(By.CSS_SELECTOR, ".tj-area.tj-hot")
    assert [a.get_attribute("data-site") for a in hot] == ["0"]
    assert lines[-1] == "click to keep these details"
    # off the chart (above it: below may lie outside the window): the tip goes
    ActionChains(driver).move_by_offset(0, -int(box["height"]) - 10).perform()
    assert not tip.is_displayed()
    assert _errors(driver) == []


@pytest.mark.parametrize("scheme", SCHEMES)
def test_the_scheme_sets_readable_colours_and_the_screenshot_is_not_blank(driver, page, scheme):
    _open(driver, page, scheme)
    root = driver.find_element(By.CSS_SELECTOR, ".tjtl")
    bg = _luminance(_rgb(root.value_of_css_property("background-color")))
    fg = _luminance(_rgb(root.value_of_css_property("color")))
    assert (bg > 0.8) if scheme == "light" else (bg < 0.05)
    assert (max(bg, fg) + 0.05) / (min(bg, fg) + 0.05) > 7  # text contrast (WCAG AAA)
    from PIL import Image

    shot = Image.open(io.BytesIO(driver.get_screenshot_as_png())).convert("RGB")
    colours = shot.getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 50
    big = [c for n, c in colours if n > 300]  # the areas' fills, not anti-aliasing
    assert len(big) >= TOP + 2


def _two_devices() -> tlm.Timeline:
    tl = tlm.Timeline()
    tl._loaded = True  # made of TimelineEvents, as a loaded one
    tl.start_time = 0.0
    for i, (device, nbytes) in enumerate([("gpu:0", 4096), ("gpu:1", 1024), ("gpu:1", 2048)]):
        ev = tlm.TimelineEvent("alloc", i * 1e-3, nbytes, device, None, "", (nbytes // 4,),
                               "float32", (i + 1,), i + 1, "", ((device, nbytes),))  # fmt: skip
        tl._append(ev, nbytes)
    return tl


def test_the_device_selector_shows_one_device_at_a_time(driver, tmp_path):
    path = tmp_path / "devices.html"
    _two_devices().save_html(path)
    _open(driver, path, "light")
    buttons = driver.find_elements(By.CSS_SELECTOR, ".tj-devices button")
    assert [b.text for b in buttons] == ["gpu:0 · peak 4.0 KiB", "gpu:1 · peak 3.0 KiB"]
    shown = driver.find_elements(By.CSS_SELECTOR, ".tj-chart:not([hidden])")
    assert [c.get_attribute("data-device") for c in shown] == ["0"]
    buttons[1].click()
    shown = driver.find_elements(By.CSS_SELECTOR, ".tj-chart:not([hidden])")
    assert [c.get_attribute("data-device") for c in shown] == ["1"]
    assert shown[0].find_element(By.CSS_SELECTOR, ".tj-peak text").text == "peak 3.0 KiB"
    assert buttons[1].get_attribute("aria-pressed") == "true"
    assert _errors(driver) == []


def synthetic(n_events: int, sites: int = 15) -> tlm.Timeline:
    """A timeline of ``n_events`` events: allocations and frees over ``sites`` sites in
    a loop of scopes, with a slow rise and fall (as a training run with a leak would)."""
    gc.disable()  # a million young tuples would run many full collections: only slower
    try:
        return _synthetic(n_events, sites)
    finally:
        gc.enable()


def _synthetic(n_events: int, sites: int) -> tlm.Timeline:
    tl = tlm.Timeline(max_events=n_events)
    tl._loaded = True  # made of TimelineEvents, as a loaded one
    tl.start_time, tl.started_at = 0.0, 0.0
    site_list = [tj.Site(f"train_{i % 4}.py", 10 + i, f"layer{i}") for i in range(sites)]
    live: list[tuple[int, tlm.TimelineEvent]] = []
    number, t, i = 0, 0.0, 0
    rng = random.Random(0)
    while i < n_events:
        t += 1e-5
        if i % 200 == 0:
            kind = "scope_enter" if i % 400 == 0 else "scope_exit"
            ev = tlm.TimelineEvent(kind, t, 0, "", None, "train/step", (), "", (), i // 400, "step")
            tl._append(ev, 0)
            i += 1
            continue
        grow = len(live) < 50 + (i * 400 // n_events if i < n_events // 2 else 0)
        if grow or not live:
            number += 1
            s = rng.randrange(sites)
            nbytes = 4096 * (s + 1)
            ev = tlm.TimelineEvent("alloc", t, nbytes, "cpu:0", site_list[s], "train/step",
                                   (nbytes // 4,), "float32", (number,), number, "",
                                   (("cpu:0", nbytes),))  # fmt: skip
            live.append((nbytes, ev))
            tl._append(ev, nbytes)
        else:
            k = rng.randrange(len(live))
            live[k], live[-1] = live[-1], live[k]
            nbytes, a = live.pop()
            tl._append(a._replace(kind="free", time=t), -nbytes)
        i += 1
    return tl


def test_a_million_events_render_to_a_small_page_that_loads_and_draws(driver, tmp_path):
    tl = synthetic(1_000_000)
    assert len(tl.events) == 1_000_000
    path = tmp_path / "million.html"
    tl.save_html(path)
    assert path.stat().st_size < 3_000_000  # aggregated: no path per buffer
    svg = _open(driver, path, "light")
    assert len(svg.find_elements(By.CSS_SELECTOR, ".tj-area")) == 11
    assert svg.find_elements(By.CSS_SELECTOR, ".tj-band")
    assert driver.find_elements(By.CSS_SELECTOR, ".tj-peak-table tbody tr")
    assert _errors(driver) == []


def test_many_scopes_draw_few_bands(driver, tmp_path):
    tl = tlm.Timeline()
    tl._loaded = True  # made of TimelineEvents, as a loaded one
    t = 0.0
    for i in range(20_000):  # 10,000 scopes "step", one after the other
        t += 1e-6
        kind = "scope_enter" if i % 2 == 0 else "scope_exit"
        tl._append(
            tlm.TimelineEvent(kind, t, 0, "", None, "step", (), "", (), i // 2, "step"),
            0,
        )
    ev = tlm.TimelineEvent("alloc", t, 4, "cpu:0", None, "", (1,), "float32", (), 10**6, "",
                           (("cpu:0", 4),))  # fmt: skip
    tl._append(ev, 4)
    path = tmp_path / "scopes.html"
    tl.save_html(path)
    svg = _open(driver, path, "light")
    bands = svg.find_elements(By.CSS_SELECTOR, ".tj-band")
    assert 0 < len(bands) < 50  # neighbours too narrow for a label share one
    assert any("step ×" in b.get_attribute("data-name") for b in bands)  # noqa: RUF001
    assert _errors(driver) == []


def test_two_timelines_on_one_page_draw_each_its_own(driver, tmp_path):
    """Each page's script finds its own page (document.currentScript), as in a notebook."""
    with tj.timeline() as tl:
        params = tidy.run("load_params", tensors_at_sites, 3, "one.py")
    tj.dispose(params)
    body = tl._repr_html_() + _two_devices()._repr_html_()
    path = tmp_path / "two.html"
    path.write_text(f'<!doctype html><meta charset="utf-8"><body>{body}</body>', encoding="utf-8")
    driver.get(path.as_uri())
    ready = ".tjtl[data-ready]"
    WebDriverWait(driver, 10).until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ready)) == 2)
    first, second = driver.find_elements(By.CSS_SELECTOR, ".tjtl")
    assert len(first.find_elements(By.CSS_SELECTOR, "svg.tj-live")) == 1
    assert len(second.find_elements(By.CSS_SELECTOR, "svg.tj-live")) == 2  # one per device
    legend = [li.text for li in first.find_elements(By.CSS_SELECTOR, ".tj-legend li")]
    assert sorted(map(_inner, legend)) == [f"one.py:{i} in <module>" for i in (1, 2, 3)]
    assert len(second.find_elements(By.CSS_SELECTOR, ".tj-devices button")) == 2
    assert not first.find_elements(By.CSS_SELECTOR, ".tj-devices")
    assert _errors(driver) == []


def test_nested_scopes_are_bands_in_lanes_and_the_legend_is_drawn(driver, tmp_path):
    with tj.timeline() as tl, tidy("outer"):
        for _ in range(2):
            with tidy("inner"):
                tj.tensor(np.ones(64, np.float32))
    path = tmp_path / "nested.html"
    tl.save_html(path)
    svg = _open(driver, path, "light")
    bands = sorted(
        (
            b.get_attribute("data-name"),
            float(b.find_element(By.TAG_NAME, "rect").get_attribute("y")),
        )
        for b in svg.find_elements(By.CSS_SELECTOR, ".tj-band")
    )
    assert [name for name, _ in bands] == ["inner", "inner", "outer"]
    assert bands[0][1] == bands[1][1] > bands[2][1]  # the inner scopes in the lane below
    (item,) = driver.find_elements(By.CSS_SELECTOR, ".tj-legend li")  # one site
    swatch = item.find_element(By.CSS_SELECTOR, ".tj-sw")
    area = svg.find_element(By.CSS_SELECTOR, ".tj-area")
    assert _rgb(swatch.value_of_css_property("background-color")) == _rgb(
        area.value_of_css_property("fill")
    )
    assert _errors(driver) == []
