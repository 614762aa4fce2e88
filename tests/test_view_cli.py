"""``python -m tidyjax view``: the page's file:// URL, ``--open``, folders, ``--chrome-trace``,
and one-line errors with exit status 2 (in process through ``main(argv)``, and in a subprocess)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import tidyjax as tj
from tidyjax import __main__ as cli


@pytest.fixture
def dumped(tmp_path) -> pathlib.Path:
    with tj.timeline() as tl, tj.tidy("step"):
        tj.tensor(np.ones(16, np.float32))
    path = tmp_path / "memory.json"
    tl.dump(path)
    return path


@pytest.fixture
def opened(monkeypatch) -> list[str]:
    """The URLs ``webbrowser.open`` was asked to open (none is, for real)."""
    urls: list[str] = []

    def record(url: str, *args: object, **kwargs: object) -> bool:
        urls.append(url)
        return True

    monkeypatch.setattr(cli.webbrowser, "open", record)
    return urls


def test_without_open_it_prints_the_file_url_of_the_page(dumped, capsys, opened):
    assert cli.main(["view", str(dumped)]) == 0
    page = dumped.with_suffix(".html")
    assert page.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    out = capsys.readouterr().out.splitlines()
    assert out == [f"wrote {page}", page.resolve().as_uri()]
    assert out[-1].startswith("file:///")
    assert opened == []


def test_open_opens_the_page_url_in_the_browser(dumped, capsys, opened):
    assert cli.main(["view", str(dumped), "--open"]) == 0
    page = dumped.with_suffix(".html")
    assert opened == [page.resolve().as_uri()]
    assert capsys.readouterr().out.splitlines() == [f"wrote {page}"]


@pytest.mark.parametrize("failure", ["returns False", "raises"])
def test_open_without_a_browser_prints_the_url(dumped, capsys, monkeypatch, failure):
    def fail(url: str, *args: object, **kwargs: object) -> bool:
        if failure == "raises":
            raise cli.webbrowser.Error("could not locate runnable browser")
        return False

    monkeypatch.setattr(cli.webbrowser, "open", fail)
    assert cli.main(["view", str(dumped), "--open"]) == 0
    captured = capsys.readouterr()
    page = dumped.with_suffix(".html").resolve()
    assert captured.out.splitlines()[-1] == page.as_uri()
    assert "no web browser could be started" in captured.err


def test_a_missing_output_folder_is_created_and_a_folder_gets_the_page(dumped, tmp_path, capsys):
    out = tmp_path / "new" / "deeper" / "page.html"
    assert cli.main(["view", str(dumped), "-o", str(out)]) == 0
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert capsys.readouterr().out.splitlines()[-1] == out.resolve().as_uri()
    folder = tmp_path / "pages"
    assert cli.main(["view", str(dumped), "-o", str(folder) + "/"]) == 0
    assert (folder / "memory.html").exists()
    assert cli.main(["view", str(dumped), "-o", str(folder)]) == 0  # an existing folder
    assert sorted(p.name for p in folder.iterdir()) == ["memory.html"]


def test_chrome_trace_writes_the_trace_beside_the_page(dumped, tmp_path, capsys):
    trace = tmp_path / "traces" / "memory.trace.json"
    assert cli.main(["view", str(dumped), "--chrome-trace", str(trace)]) == 0
    data = json.loads(trace.read_text(encoding="utf-8"))
    slices = [e for e in data["traceEvents"] if e["ph"] == "X"]
    assert [e["name"] for e in slices] == ["step"]
    assert any(e["ph"] == "C" and e["args"]["bytes in use"] == 64 for e in data["traceEvents"])
    assert f"wrote {trace}" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (None, "cannot read it"),
        ("{not json", "not a JSON file"),
        ("<!DOCTYPE html><html></html>", "not a JSON file"),
        ('{"format": "something"}', "not a tidyjax timeline or snapshot"),
    ],
)
def test_a_bad_input_is_one_line_and_exit_2(tmp_path, capsys, opened, text, message):
    path = tmp_path / "in.json"
    if text is not None:
        path.write_text(text)
    assert cli.main(["view", str(path), "--open"]) == 2
    captured = capsys.readouterr()
    err = captured.err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"tidyjax view: {path}") and message in err[0]
    assert captured.out == "" and opened == []
    assert not (tmp_path / "in.html").exists()


def test_an_output_that_cannot_be_written_is_one_line_and_exit_2(dumped, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    out = blocker / "page.html"  # a folder that is a file
    assert cli.main(["view", str(dumped), "-o", str(out)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"tidyjax view: {out}: cannot write the page")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tidyjax", "view", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_in_a_subprocess_the_url_and_the_errors(dumped, tmp_path):
    out = tmp_path / "sub" / "page.html"
    proc = run(str(dumped), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [f"wrote {out}", out.resolve().as_uri()]
    assert out.exists()
    for bad in (tmp_path / "missing.json", dumped.with_name("broken.json")):
        if bad.name == "broken.json":
            bad.write_text('{"format": "tidyjax.timeline"')
        proc = run(str(bad))
        assert proc.returncode == 2
        assert "Traceback" not in proc.stderr
        assert len(proc.stderr.splitlines()) == 1 and str(bad) in proc.stderr
