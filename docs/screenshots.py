"""Regenerate the docs' pictures of displays: ``python docs/screenshots.py [NAME ...]`` (every
picture, or those named: ``timeline``, ``leaks``, ``memory``, ``plan``).

Runs a small training program with tidyjax (its source below, compiled as ``train.py`` so the
creation sites read as a user's), builds three displays from what it did (the timeline page,
a leak report, ``memory()``), and a fourth from the notebook session of
``docs/guide-plan.md`` (its ``<!-- ipython -->`` cells, run in IPython as a notebook runs them:
the plan its last cell shows). It renders each in headless Chromium (Debian's ``chromium`` and
``chromium-driver``, through Selenium) at twice the CSS pixel size, in a light and a dark host,
crops each to its element and writes palette PNGs under ``docs/img/``: ``timeline.png``,
``leaks.png``, ``memory.png``, ``plan.png`` and their ``-dark`` variants. ``docs/index.md``
shows the first three, ``docs/guide-plan.md`` the plan, with Material's ``#only-light`` /
``#only-dark`` suffixes; the README shows the timeline through a ``<picture>`` that follows
``prefers-color-scheme``.

Needs the ``test`` extra (selenium, Pillow through matplotlib) and chromium-driver.
"""

from __future__ import annotations

import contextlib
import gc
import io
import pathlib
import re
import shutil
import sys
import tempfile
from typing import Any

import jax
import jax.numpy as jnp

import tidyjax as tj
from tidyjax import _sites

# The pictures show what a user of train.py sees: this script runs it, as a runner would (a
# site's chain of user frames ends at a runner's frame), so no frame of it shows in a chain.
_runner = _sites.is_runner_file
_sites.is_runner_file = lambda file: file == __file__ or _runner(file)

IMG = pathlib.Path(__file__).resolve().parent / "img"
PLAN_GUIDE = IMG.parent / "guide-plan.md"
# CSS pixels of the browser window: the timeline page fills it, about the docs' text column, so
# its text shows about 1:1 there; the tables take their own width, a window wide enough for them.
WIDTH = {"timeline": 720, "leaks": 900, "memory": 900, "plan": 900}
SCALE = 2  # device pixels per CSS pixel
MAX_BYTES = 150_000  # each PNG stays below this (tests/test_docs.py checks)

# The docs theme's page backgrounds (Material's default and slate schemes).
BACKGROUND = {"light": "#ffffff", "dark": "#1e2129"}
INK = {"light": "#1f2328", "dark": "#e2e4e9"}

# The program the pictures show. Compiled as "train.py": the displays name its lines.
PROGRAM = """
import jax
import jax.numpy as jnp
import tidyjax as tj
import tidyjax.numpy as tnp


def init(key):
    k1, k2 = jax.random.split(key)
    return [tj.Variable(jax.random.normal(k1, (512, 1024)), name="w1"),
            tj.Variable(jax.random.normal(k2, (1024, 256)), name="w2")]


@tj.tidy("step")
def step(params, x):
    with tj.tidy("forward"):
        h = tnp.tanh(x @ params[0])
        loss = ((h @ params[1]) ** 2).mean()
    with tj.tidy("update"):
        for p in params:
            p.assign(p * 0.999)
    return loss


def train(params, steps, cache):
    for i in range(steps):
        x = tj.tensor(jnp.ones((256 * (1 + i % 3), 512)))
        step(params, x).dispose()
        cache.append(tj.keep(x[:64]))  # a cache that is never emptied


def evaluate(params):
    outs = []
    for _ in range(4):
        outs.append(tnp.tanh(tj.tensor(jnp.ones((1024, 512))) @ params[0]))
    total = 0.0
    for out in outs:
        total += float(out.mean())
    return total


def optimizer_state():
    return {"mu": jnp.zeros((512, 1024)), "nu": jnp.zeros((512, 1024))}


def metrics(steps):
    history = []
    for _ in range(steps):
        history.append(jnp.ones((64, 1024)))  # plain jax.Arrays, kept in a list
    return history


def leaky_step(params, x, history):
    y = tnp.tanh(x @ params[0])
    history.append(y)                 # kept by mistake: one Tensor per step
    stats = jnp.ones((256, 256)) * 2  # a plain jax.Array, kept too
    history.append(stats)
    return float(y.mean())
"""


def program() -> dict[str, Any]:
    namespace: dict[str, Any] = {}
    exec(compile(PROGRAM, "train.py", "exec"), namespace)
    return namespace


def timeline_html(p: dict[str, Any]) -> str:
    cache: list[tj.Tensor] = []
    with tj.timeline() as tl:
        params = p["init"](jax.random.key(0))
        with tj.tidy("train"):
            p["train"](params, 24, cache)
        with tj.tidy("evaluate"):
            p["evaluate"](params)
        tj.dispose(cache)
        tj.dispose_variables()
    return str(tl.to_html())


def leaks_html(p: dict[str, Any]) -> str:
    params = p["init"](jax.random.key(1))
    history: list[Any] = []
    x = tj.tensor(jnp.ones((128, 512)))
    p["leaky_step"](params, x, history)  # the first call fills JAX's caches
    report = None
    try:
        with tj.check_leaks():
            for _ in range(3):
                p["leaky_step"](params, x, history)
    except tj.LeakError as err:
        report = err.report
    assert report is not None, "the leaky step leaked nothing?"
    out = str(report._repr_html_())
    tj.dispose([x, history])
    tj.dispose_variables()
    return out


def memory_html(p: dict[str, Any]) -> str:
    params = p["init"](jax.random.key(2))
    cache: list[tj.Tensor] = []
    with tj.tidy("train"):
        p["train"](params, 3, cache)
    optimizer = tj.watch(p["optimizer_state"](), "optimizer")
    stray = p["metrics"](3)  # plain arrays tidyjax does not own
    out = str(tj.memory()._repr_html_())
    tj.unwatch(optimizer)
    del optimizer, stray
    tj.dispose(cache)
    tj.dispose_variables()
    gc.collect()
    return out


def plan_html(p: dict[str, Any]) -> str:
    """The plan the notebook session of ``docs/guide-plan.md`` shows, its cells run in IPython
    (so a site reads ``In[1], line 8``): the guide's text and its picture show one session."""
    from IPython.core.interactiveshell import InteractiveShell

    text = PLAN_GUIDE.read_text(encoding="utf-8")
    (session,) = re.findall(r"^<!-- ipython -->\n```python\n(.*?)^```", text, re.S | re.M)
    cells = [c for c in re.split(r"^# In\[\d*\].*\n", session, flags=re.M) if c.strip()]
    shell = InteractiveShell.instance()
    for cell in cells:
        with contextlib.redirect_stdout(io.StringIO()):  # the text of Out[2]
            result = shell.run_cell(cell, store_history=True)
        assert result.success, f"{cell}\n{result.error_before_exec or result.error_in_exec!r}"
    out = str(shell.user_ns["p"]._repr_html_())
    tj.dispose([v for v in list(shell.user_ns.values()) if isinstance(v, tj.Tensor)])
    shell.reset(new_session=False)
    gc.collect()
    return out


BUILD = {"timeline": timeline_html, "leaks": leaks_html, "memory": memory_html, "plan": plan_html}


def host_page(body: str, theme: str) -> str:
    """A plain page in the docs' colours, marked light or dark as a themed host marks itself."""
    return (
        f'<!doctype html><html data-theme="{theme}"><head><meta charset="utf-8">'
        f"<style>html,body{{margin:0;background:{BACKGROUND[theme]};color:{INK[theme]};"
        "font-family:system-ui,sans-serif}#shot{display:inline-block;padding:12px 16px}"
        f"</style></head><body><div id=shot>{body}</div></body></html>"
    )


def driver() -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    chromedriver = shutil.which("chromedriver")
    if browser is None or chromedriver is None:
        sys.exit("needs Debian's chromium and chromium-driver (apt-get install chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--window-size=900,1400",
        f"--force-device-scale-factor={SCALE}",
    ):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(chromedriver), options=options)


def small_png(png: bytes, path: pathlib.Path) -> None:
    """Write ``png`` as a palette PNG, with fewer colours until it is below ``MAX_BYTES``."""
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB")
    for colors in (128, 64, 32):
        buf = io.BytesIO()
        palette = image.quantize(colors, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
        palette.save(buf, "PNG", optimize=True)
        if buf.tell() < MAX_BYTES:
            break
    path.write_bytes(buf.getvalue())
    print(
        f"wrote {path.relative_to(IMG.parent.parent)}: {image.width}x{image.height}, "
        f"{buf.tell() / 1000:.0f} kB, {colors} colours"
    )


def shoot(
    d: Any, page: pathlib.Path, selector: str, theme: str, width: int, path: pathlib.Path
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    d.set_window_size(width, 1400)
    d.execute_cdp_cmd(
        "Emulation.setEmulatedMedia",
        {"features": [{"name": "prefers-color-scheme", "value": theme}]},
    )
    d.get(page.as_uri())
    element = WebDriverWait(d, 30).until(lambda d: d.find_element(By.CSS_SELECTOR, selector))
    small_png(element.screenshot_as_png, path)


def main(names: list[str]) -> None:
    unknown = sorted(set(names) - set(BUILD))
    if unknown:
        sys.exit(f"no picture named {', '.join(unknown)}: choose from {', '.join(BUILD)}")
    p = program()
    pages = {name: BUILD[name](p) for name in BUILD if name in (names or BUILD)}
    IMG.mkdir(exist_ok=True)
    d = driver()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for name, html in pages.items():
                for theme in ("light", "dark"):
                    page = pathlib.Path(tmp) / f"{name}-{theme}.html"
                    if name == "timeline":  # a whole page: it follows prefers-color-scheme
                        page.write_text(html, encoding="utf-8")
                        selector = ".tjtl[data-ready]"
                    else:
                        page.write_text(host_page(html, theme), encoding="utf-8")
                        selector = "#shot"
                    suffix = "" if theme == "light" else "-dark"
                    shoot(d, page, selector, theme, WIDTH[name], IMG / f"{name}{suffix}.png")
    finally:
        d.quit()


if __name__ == "__main__":
    main(sys.argv[1:])
