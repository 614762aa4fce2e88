"""The documentation site builds strictly, and a real browser finds the API reference."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

import tidyjax

from .conftest import chromium

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


def test_docs_build_strictly_and_the_api_page_shows_tidy(tmp_path):
    pytest.importorskip("mkdocs", reason="pip install -e '.[docs]'")
    site = tmp_path / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, NO_MKDOCS_2_WARNING="1"),
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    browser = chromium()
    api = _dom(browser, site / "api" / "index.html")
    assert 'id="tidyjax.tidy"' in api  # the entry, generated from the docstrings
    assert "Run code in a scope that frees every buffer it created" in api
    assert 'id="tidyjax.memory"' in api and "all_processes" in api
    guide = _dom(browser, site / "quickstart" / "index.html")
    assert "Using a disposed Tensor raises" in guide  # the README's quickstart, included


@pytest.mark.skipif(
    not os.environ.get("TIDYJAX_EXPECT_INSTALLED"), reason="only when testing an installed wheel"
)
def test_the_installed_wheel_is_what_runs_and_it_is_typed():
    where = pathlib.Path(tidyjax.__file__).resolve().parent
    assert "site-packages" in where.parts, where
    assert (where / "py.typed").is_file()
    for module in ("numpy", "lax", "nn", "random", "pytest_plugin", "ipython"):
        __import__(f"tidyjax.{module}")
