"""Shared by the browser tests: Debian's headless Chromium, and the JavaScript that reads the
colours a reader sees (through a canvas, so any CSS colour syntax resolves to pixels)."""

from __future__ import annotations

import os
import shutil
from typing import Any

import pytest

#: JavaScript declarations: ``rgba(css)``, ``over(top, base)``, ``lum(c)``, ``contrast(a, b)``,
#: ``behind(el)`` (the colour under an element) and ``ownText(el)``; paste inside a function.
COLOUR_JS = """
const ctx = document.createElement('canvas').getContext('2d', {willReadFrequently: true});
const rgba = (css) => {  // any CSS colour (color-mix included), through a canvas
  ctx.clearRect(0, 0, 1, 1); ctx.fillStyle = '#000'; ctx.fillStyle = css;
  ctx.fillRect(0, 0, 1, 1);
  const d = ctx.getImageData(0, 0, 1, 1).data;
  return [d[0], d[1], d[2], d[3] / 255];
};
const over = (top, base) => [0, 1, 2].map(i => top[i] * top[3] + base[i] * (1 - top[3]));
const linear = (v) => (v /= 255) <= 0.04045 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4;
const lum = (c) => 0.2126 * linear(c[0]) + 0.7152 * linear(c[1]) + 0.0722 * linear(c[2]);
const contrast = (a, b) => {
  const [x, y] = [lum(a), lum(b)].sort((p, q) => q - p);
  return (x + 0.05) / (y + 0.05);
};
const behind = (el) => {  // the colour under el: its ancestors' backgrounds, composed on white
  const chain = [];
  for (let e = el; e; e = e.parentElement) chain.unshift(e);
  let base = [255, 255, 255];
  for (const e of chain) {
    const c = rgba(getComputedStyle(e).backgroundColor);
    if (c[3] > 0) base = over(c, base);
  }
  return base;
};
const ownText = (el) => [...el.childNodes].filter(n => n.nodeType === 3)
  .map(n => n.textContent).join('').trim();
"""


def _chromium() -> str | None:
    for path in ("/usr/lib/chromium/chromium", "/usr/lib/chromium-browser/chromium-browser"):
        if os.path.exists(path):  # Debian's binary, not its launcher script
            return path
    return shutil.which("chromium") or shutil.which("chromium-browser")


def headless_chromium(width: int = 1200, height: int = 1000) -> Any:
    """Debian's headless Chromium under Selenium, its console log kept; skips (fails on CI)
    without it."""
    pytest.importorskip("selenium", reason="pip install selenium (the test extra)")
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    browser, chromedriver = _chromium(), shutil.which("chromedriver")
    if browser is None or chromedriver is None:
        if os.environ.get("CI"):
            pytest.fail("CI must install chromium and chromium-driver (see .ci/run).")
        pytest.skip(
            "needs headless Chromium and its driver: apt-get install -y chromium chromium-driver"
        )
    options = Options()
    options.binary_location = browser
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        f"--window-size={width},{height}",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(chromedriver), options=options)
