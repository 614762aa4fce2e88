"""The timeline page draws each ``tidyjax.jit`` call's XLA temporaries as a band of their own
(issue 42, item 1): "XLA temporaries of step", stacked on the arrays alive when the call
returned, so that column reaches the device peak; the arrays' replay unchanged, the band the same
after save and load, and absent where no call held temporaries."""

from __future__ import annotations

import base64
import gc
import re
from typing import Any

import jax
import jax.numpy as jnp
import pytest

import tidyjax as tj
from tidyjax import _timeline as tlm
from tidyjax import _timeline_html
from tidyjax._format import fmt_bytes

from .test_timeline import page_data

N = 512


def step(x: Any) -> Any:
    y = jnp.sin(x) @ jnp.cos(x)
    return jnp.tanh(y @ jnp.sin(y)) + 1.0


def evaluate(x: Any) -> Any:
    return jnp.tanh(jnp.exp(x) @ x)


def double(x: Any) -> Any:
    return x * 2.0


jit_step, jit_evaluate, jit_double = tj.jit(step), tj.jit(evaluate), tj.jit(double)


@pytest.fixture(scope="module")
def temp_bytes() -> dict[str, int]:
    """XLA's temporaries of each function on a ``N``x``N`` float32 argument, as
    ``memory_analysis()`` gives them here: step's and evaluate's are not 0 (else every test
    of the band would pass with nothing drawn), double's are."""
    x = jnp.ones((N, N), jnp.float32)
    found = {
        f.__name__: jax.jit(f).lower(x).compile().memory_analysis().temp_size_in_bytes
        for f in (step, evaluate, double)
    }
    assert found["step"] > 0 and found["evaluate"] > 0, found
    assert found["double"] == 0, found
    return found


@pytest.fixture(autouse=True)
def _clean():
    gc.collect()
    yield
    gc.collect()


@pytest.fixture
def x():
    t = tj.tensor(jnp.ones((N, N), jnp.float32))
    jax.block_until_ready(t.array)
    yield t
    t.dispose()


def columns(data: dict[str, Any], j: int = 0) -> list[list[int]]:
    """Device ``j``'s fine columns, each slot's bytes (the page embeds each column as its
    change from the one before)."""
    k, cols, prev = len(data["sites"]), data["devices"][j]["cols"], [0] * len(data["sites"])
    out = []
    for f in range(data["fine"]):
        prev = [p + c for p, c in zip(prev, cols[f * k : (f + 1) * k], strict=True)]
        out.append(prev)
    return out


def band_slots(data: dict[str, Any]) -> dict[str, int]:
    """The temporaries' series: label to slot."""
    return {site["label"]: s for s, site in enumerate(data["sites"]) if site.get("temps")}


def static_images(page: str) -> list[str]:
    """The static images' SVG (what sanitized hosts show)."""
    return [
        base64.b64decode(src).decode("utf-8")
        for src in re.findall(r'src="data:image/svg\+xml;base64,([^"]+)"', page)
    ]


def column_of(data: dict[str, Any], events: list[Any], ev: Any) -> int:
    """The fine column ``ev`` falls in (the events are the page's: none dropped)."""
    return events.index(ev) * data["fine"] // data["events"]


def training(x: Any, fn: Any, steps: int = 3) -> tlm.Timeline:
    """``steps`` calls of ``fn``, each in a scope "train/step" that frees its output."""
    with tj.timeline(sample=None) as tl, tj.tidy("train"):
        for _ in range(steps):
            with tj.tidy("step"):
                fn(x)
    return tl


def test_the_chart_draws_the_temporaries_as_a_band_over_the_arrays_alive_then(x, temp_bytes):
    tl = training(x, jit_step)
    events = tl.events
    temps = [ev for ev in events if ev.kind == "temporaries"]
    nbytes = temp_bytes["step"]
    assert [(ev.name, ev.bytes) for ev in temps] == [("step", nbytes)] * 3
    page = tl.to_html()
    data = page_data(page)
    (band,) = band_slots(data).values()
    site = data["sites"][band]
    assert site["label"] == "XLA temporaries of step" and site["temps"] is True
    assert band == len(data["sites"]) - 1  # the top of the stack
    assert (site["allocs"], site["scopes"]) == (3, "train/step ×3")  # noqa: RUF001
    cols = columns(data)
    at = [column_of(data, events, ev) for ev in temps]
    assert [cols[k][band] for k in at] == [nbytes] * 3
    assert sum(col[band] for col in cols) == 3 * nbytes  # in no other column
    for ev, k in zip(temps, at, strict=True):  # over the arrays alive when the call returned
        assert sum(cols[k]) - nbytes == sum(r.bytes for r in tl.live_at(ev.time)) == 2 * x.nbytes
    # the tallest column is the device peak, marked as such; the arrays' replay is unchanged
    assert tl.peak_bytes == 2 * x.nbytes  # the argument and one step's output
    assert tl.device_peak_bytes == tl.peak_bytes + nbytes
    assert max(sum(col) for col in cols) == tl.device_peak_bytes
    assert max(sum(col) - col[band] for col in cols) == tl.peak_bytes
    (device,) = data["devices"]
    assert device["peak"] == tl.device_peak_bytes and device["peakCol"] == at[0]
    assert device["peakText"] == f"device peak {fmt_bytes(tl.device_peak_bytes)}"
    assert device["label"].endswith(" · " + device["peakText"])
    # the static image (sanitized hosts): the band in each call's column, the device peak
    (svg,) = static_images(page)
    band_path = re.search(r'<path class="tj-temp" d="([^"]+)"/>', svg)
    assert band_path is not None and band_path.group(1).count("M") == 3
    assert f"device peak {fmt_bytes(tl.device_peak_bytes)}</text>" in svg
    assert "with the XLA temporaries of step" in re.search(r'alt="([^"]+)"', page).group(1)


def test_a_band_per_function_the_largest_lowest(x, temp_bytes):
    with tj.timeline(sample=None) as tl, tj.tidy("run"):
        with tj.tidy("train"):
            jit_step(x)
        with tj.tidy("eval"):
            jit_evaluate(x)
            jit_evaluate(x)
    data = page_data(tl.to_html())
    slots = band_slots(data)
    by_size = sorted(("step", "evaluate"), key=lambda name: -temp_bytes[name])
    assert list(slots) == [f"XLA temporaries of {name}" for name in by_size]
    cols = columns(data)
    for name, calls in (("step", 1), ("evaluate", 2)):
        s = slots[f"XLA temporaries of {name}"]
        drawn = [col[s] for col in cols if col[s]]
        assert drawn == [temp_bytes[name]] * calls
        assert data["sites"][s]["allocs"] == calls
    assert data["sites"][slots["XLA temporaries of evaluate"]]["scopes"] == "run/eval ×2"  # noqa: RUF001
    assert max(sum(col) for col in cols) == tl.device_peak_bytes


def test_no_band_without_temporaries(x, temp_bytes):
    with tj.timeline(sample=None) as eager, tj.tidy("step"):
        x * 2.0
    with tj.timeline(sample=None) as none, tj.tidy("step"):  # a call with 0 B of temporaries
        jit_double(x)
    assert all(ev.bytes == 0 for ev in none.events if ev.kind == "temporaries")
    for tl in (eager, none):
        page = tl.to_html()
        data = page_data(page)
        assert band_slots(data) == {} and not any(s.get("temps") for s in data["sites"])
        (device,) = data["devices"]
        assert "peakText" not in device and device["peak"] == tl.peak_bytes
        assert max(sum(col) for col in columns(data)) == tl.peak_bytes == tl.device_peak_bytes
        (svg,) = static_images(page)
        assert 'class="tj-temp"' not in svg and f"peak {fmt_bytes(tl.peak_bytes)}</text>" in svg
        assert "device peak" not in svg
        shown = re.sub(r"<(script|style)\b.*?</\1>", "", page, flags=re.S)  # the assets aside
        assert "XLA temporaries" not in shown and "device peak" not in shown


def test_the_band_is_the_same_after_save_and_load(x, temp_bytes, tmp_path):
    tl = training(x, jit_step, steps=2)
    path = tmp_path / "t.json"
    tl.dump(path)
    assert len(tl.to_json()["temporaries"]) == 2  # a table of its own in the file
    back = tj.Timeline.load(path)
    page, again = tl.to_html(), back.to_html()
    data = page_data(again)
    assert data == page_data(page)
    assert static_images(again) == static_images(page)
    (band,) = band_slots(data).values()
    assert [col[band] for col in columns(data) if col[band]] == [temp_bytes["step"]] * 2
    assert max(sum(col) for col in columns(data)) == back.device_peak_bytes
    assert back.peak_bytes == tl.peak_bytes


# -- built through the plain API: several devices, many functions ----------------------------


def _event(kind: str, t: float, per_device: dict[str, int], name: str = "", buffer: int = 0
           ) -> tlm.TimelineEvent:  # fmt: skip
    nbytes, device = sum(per_device.values()), ",".join(per_device)
    shape = () if kind == "temporaries" else (nbytes // 4,)
    return tlm.TimelineEvent(kind, t, nbytes, device, None, "", shape,
                             "" if kind == "temporaries" else "float32", (), buffer, name,
                             tuple(per_device.items()))  # fmt: skip


def _loaded(events: list[tlm.TimelineEvent]) -> tlm.Timeline:
    tl = tlm.Timeline()
    tl._loaded = True  # made of TimelineEvents, as a loaded one
    tl.start_time = 0.0
    for ev in events:
        tl._append(ev, {"alloc": ev.bytes, "free": -ev.bytes}.get(ev.kind, 0))
    tl._replay_calls()
    return tl


def test_each_device_draws_its_own_share_of_the_temporaries():
    tl = _loaded([
        _event("alloc", 0.001, {"gpu:0": 4096}, buffer=1),
        _event("alloc", 0.002, {"gpu:1": 1024}, buffer=2),
        _event("temporaries", 0.003, {"gpu:0": 1024, "gpu:1": 8192}, name="step"),
        _event("alloc", 0.004, {"gpu:0": 8192}, buffer=3),
    ])  # fmt: skip
    page = tl.to_html()
    data = page_data(page)
    (band,) = band_slots(data).values()
    zero, one = columns(data, 0), columns(data, 1)
    assert [col[band] for col in zero] == [0, 0, 1024, 0]  # not gpu:0's peak: drawn all the same
    assert [col[band] for col in one] == [0, 0, 8192, 0]
    assert [sum(col) for col in zero] == [4096, 4096, 5120, 12288]
    assert [sum(col) for col in one] == [0, 1024, 9216, 1024]
    first, second = data["devices"]
    assert (first["peak"], first["label"], "peakText" in first) == (12288, "gpu:0 · peak 12.0 KiB",
                                                                    False)  # fmt: skip
    assert (second["peak"], second["peakCol"], second["label"]) == (
        9216, 2, "gpu:1 · device peak 9.0 KiB")  # fmt: skip
    assert "gpu:1 · device peak 9.0 KiB</div>" in page
    assert data["selected"] == 0  # the larger peak
    assert [svg.count('class="tj-temp"') for svg in static_images(page)] == [1, 1]


def test_beyond_the_largest_functions_the_rest_share_one_band():
    n = _timeline_html.TEMP_BANDS + 2
    events = [_event("alloc", 0.001, {"cpu:0": 4}, buffer=1)]
    events += [_event("temporaries", 0.01 * (i + 1), {"cpu:0": 1000 * (i + 1)}, name=f"f{i}")
               for i in range(n)]  # fmt: skip
    data = page_data(_loaded(events).to_html())
    labels = list(band_slots(data))
    assert labels == [f"XLA temporaries of f{i}" for i in range(n - 1, 1, -1)] + [
        "XLA temporaries of 2 other functions"
    ]
    rest = data["sites"][-1]
    assert (rest["allocs"], rest["shapes"]) == (2, "f1, f0")
    drawn = [sum(col[s] for s in band_slots(data).values()) for col in columns(data)]
    assert drawn == [0] + [1000 * (i + 1) for i in range(n)]


# -- in the browser ---------------------------------------------------------------------------


def test_the_browser_draws_the_band_its_legend_entry_and_tooltip(x, temp_bytes, tmp_path):
    pytest.importorskip("selenium", reason="pip install selenium (the test extra)")
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    from .headless import headless_chromium
    from .test_timeline_browser import _errors, _open, _rgb

    tl = training(x, jit_step)
    path = tmp_path / "temps.html"
    tl.save_html(path)
    driver = headless_chromium()
    try:
        for scheme in ("light", "dark"):
            svg = _open(driver, path, scheme)
            (area,) = svg.find_elements(By.CSS_SELECTOR, ".tj-area.tj-temp")
            assert area.get_attribute("data-label") == "XLA temporaries of step"
            peak = svg.find_element(By.CSS_SELECTOR, ".tj-peak text").text
            assert peak == f"device peak {fmt_bytes(tl.device_peak_bytes)}"
            (item,) = [li for li in driver.find_elements(By.CSS_SELECTOR, ".tj-legend li")
                       if li.text == "XLA temporaries of step"]  # fmt: skip
            swatch = item.find_element(By.CSS_SELECTOR, ".tj-sw")
            fill = _rgb(area.value_of_css_property("fill"))
            assert _rgb(swatch.value_of_css_property("background-color")) == fill
            sites = svg.find_elements(By.CSS_SELECTOR, ".tj-area:not(.tj-temp)")
            assert fill not in {_rgb(a.value_of_css_property("fill")) for a in sites}
            # just under the top of the device peak's column: the temporaries
            line, box = svg.find_element(By.CSS_SELECTOR, ".tj-peak line").rect, svg.rect
            dx = line["x"] - (box["x"] + box["width"] / 2)
            dy = line["y"] + 4 - (box["y"] + box["height"] / 2)
            ActionChains(driver).move_to_element_with_offset(svg, int(dx), int(dy)).perform()
            tip = driver.find_element(By.CSS_SELECTOR, ".tj-tip")
            lines = tip.text.splitlines()
            assert lines[0] == "XLA temporaries of step"
            assert lines[1].startswith(
                f"{fmt_bytes(temp_bytes['step'])} while the call ran; "
                f"{fmt_bytes(tl.device_peak_bytes)} with the arrays on "
            )
            assert lines[2:4] == ["calls over the run: 3", "scopes of those calls: train/step ×3"]  # noqa: RUF001
            assert _errors(driver) == []
    finally:
        driver.quit()
