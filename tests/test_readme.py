"""Every ```python example in README.md runs as written (the rules, and the markers that change
them, are in ``tests/test_guides.py``), and the README stays a page a newcomer finishes."""

from __future__ import annotations

import re

import pytest

from .test_guides import README, ROOT, blocks, python_blocks, run_block

BLOCKS = python_blocks([README])
MOST_LINES = 250
FIRST_EXAMPLE_BY = 60  # the line by which a newcomer reaches a working example


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_readme_example_runs(block, tmp_path, monkeypatch, capsys):
    run_block(block, tmp_path, monkeypatch)
    capsys.readouterr()


def test_readme_has_examples():
    assert len(BLOCKS) >= 3


def test_the_readme_is_short_and_starts_with_a_working_example():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MOST_LINES, "move the detail to a page under docs/"
    first = BLOCKS[0]
    assert first.marker is None and first.line <= FIRST_EXAMPLE_BY, first.id


def test_ci_runs_the_test_command_the_readme_shows():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    (command,) = re.findall(r"^python3 -m venv \.venv && .*$", ci, re.M)
    shown = [b.code.strip() for b in blocks(README) if b.lang == "bash"]
    assert command in shown, f".ci/run runs {command!r}; the README must show it as one block"
