"""``python -m tidyjax view``: the page's file:// URL, ``--open``, folders, ``--chrome-trace``,
and one-line errors with exit status 2 (in process through ``main(argv)``, and in a subprocess).

Also: ``Snapshot.load`` of a malformed file raises one tidyjax error naming the field."""

from __future__ import annotations

import copy
import json
import pathlib
import random
import subprocess
import sys
from typing import NamedTuple

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


# -- every bad file is one line and exit status 2 ----------------------------------------------

NAN, INF = float("nan"), float("inf")
DELETE = object()  # a mutation that removes the field


class Each(NamedTuple):
    """A mutation that sets every value of a column."""

    value: object


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> dict[str, dict]:
    """A valid timeline (events dropped, so base and peak events; a scope; a named Variable; a
    mark; an out-of-memory request) and a valid snapshot, as JSON data."""
    v = tj.Variable(np.zeros(4, np.float32), name="w")
    kept = tj.keep(tj.tensor(np.ones(3, np.float32)))
    with tj.timeline(max_events=6) as tl:
        with tj.tidy("step"):
            for i in range(4):
                tj.tensor(np.ones(16, np.float32)) + float(i)
        mark = tl.annotate("out of memory: add(...)", 64)
        v.assign(v + 1.0)
    timeline = tl.to_json()
    timeline["oom"] = {"time": mark.time, "what": "add(...)", "requested": 64, "called_at": None}
    snap = tj.snapshot().to_json()
    folder = tmp_path_factory.mktemp("good")
    for name, data in (("timeline", timeline), ("snapshot", snap)):
        assert "format" in data  # both draw: checked in test_the_valid_files_draw
        (folder / f"{name}.json").write_text(json.dumps(data))
    kept.dispose()
    v.dispose()
    return {"timeline": timeline, "snapshot": snap}


def _mutated(data: dict, path: tuple, value: object) -> dict:
    out = copy.deepcopy(data)
    parent = out
    for key in path[:-1]:
        parent = parent[key]
    if value is DELETE:
        del parent[path[-1]]
    elif isinstance(value, Each):
        parent[path[-1]] = [value.value] * len(parent[path[-1]])
    else:
        parent[path[-1]] = value
    return out


def _refused(path: pathlib.Path, capsys) -> str:
    """``view`` of ``path``: exit status 2 and one line on stderr naming the file (returned),
    nothing written, nothing on stdout."""
    trace = path.with_suffix(".trace.json")
    status = cli.main(["view", str(path), "--chrome-trace", str(trace)])
    captured = capsys.readouterr()
    err = captured.err.splitlines()
    assert status == 2, captured
    assert len(err) == 1 and err[0].startswith(f"tidyjax view: {path}"), captured.err
    assert captured.out == ""
    assert not path.with_suffix(".html").exists() and not trace.exists()
    return err[0]


def test_the_valid_files_draw(good, tmp_path, capsys):
    for name, data in good.items():
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(data))
        assert cli.main(["view", str(path)]) == 0, capsys.readouterr().err
        assert path.with_suffix(".html").read_text(encoding="utf-8").startswith("<!DOCTYPE")
    assert "out of memory: add(...)" in (tmp_path / "timeline.html").read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "not a JSON file"),
        ("[" * 100_000, "nested too deeply"),
        ('{"format": "tidyjax.timeline", "version": 1, "events": ' + "[" * 100_000, "nested"),
        ("{" * 100_000, "not a JSON file"),  # no key: a syntax error before any depth
        ('{"a":' * 100_000, "nested too deeply"),
        (bytes(range(256)) * 8, "not a JSON file"),
        (b"\xff\xfe{}", "not a JSON file"),
        ("9" * 5000, "not a JSON file"),  # more digits than Python converts
        ("1e999", "not a tidyjax timeline or snapshot"),
        ("[]", "not a tidyjax timeline or snapshot"),
        ("null", "not a tidyjax timeline or snapshot"),
        ('"tidyjax.timeline"', "not a tidyjax timeline or snapshot"),
        ("{}", "not a tidyjax timeline or snapshot"),
        ('{"format": ["tidyjax.timeline"]}', "not a tidyjax timeline or snapshot"),
        ('{"format": "' + "x" * 100_000 + '"}', "not a tidyjax timeline or snapshot"),
    ],
)
def test_what_is_no_tidyjax_file_is_one_line(tmp_path, capsys, content, message):
    path = tmp_path / "in.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    line = _refused(path, capsys)
    assert message in line
    assert len(line) < 400  # a long value is clipped


@pytest.mark.parametrize("kind", ["timeline", "snapshot"])
def test_a_file_without_a_version_is_not_told_to_upgrade(good, tmp_path, capsys, kind):
    path = tmp_path / "in.json"
    path.write_text(json.dumps(_mutated(good[kind], ("version",), DELETE)))
    line = _refused(path, capsys)
    assert 'no "version"' in line and f"not a tidyjax {kind} file" in line
    assert "Upgrade" not in line
    for version in ("1", 0, -1, 1.5, True, None, [1]):
        path.write_text(json.dumps(_mutated(good[kind], ("version",), version)))
        line = _refused(path, capsys)
        assert "not a format version" in line and "Upgrade" not in line, line
    newer = good[kind]["version"] + 1
    path.write_text(json.dumps(_mutated(good[kind], ("version",), newer)))
    assert "Upgrade tidyjax" in _refused(path, capsys)  # a newer tidyjax's file


def test_a_file_cut_short_anywhere_is_one_line(good, tmp_path, capsys):
    for kind, data in good.items():
        text = json.dumps(data)
        for end in (1, 10, len(text) // 3, len(text) // 2, len(text) - 1):
            path = tmp_path / f"{kind}-{end}.json"
            path.write_text(text[:end])
            assert "not a JSON file" in _refused(path, capsys)


_TIMES = ["s", None, True, [], -1, -1.0, NAN, INF, -INF, 1e300, 10**400]
_INDEXES = ["s", None, True, [], -1, 1.5, 10**6, 10**400]
_COUNTS = ["s", None, True, [], -1, 1.5, 2**63, 10**400]

TIMELINE_MUTATIONS = [
    *((("started_at",), v) for v in ["s", True, [], -1.0, NAN, INF, 1e300, 10**400]),
    *((("start_time",), v) for v in ["s", True, [], -1.0, NAN, INF, 1e300]),
    *((("stop_time",), v) for v in ["s", True, [], -1.0, NAN, -INF, 1e300]),
    *((("peak_time",), v) for v in ["s", None, True, [], -1.0, NAN, INF]),
    *((("max_events",), v) for v in ["s", None, True, 0, -1, 1.5, 2**70, 10**400]),
    *((("dropped",), v) for v in _COUNTS),
    *((("peak_bytes",), v) for v in _COUNTS),
    *(((k,), v) for k in ("events", "base") for v in ["s", None, [], 5, {}]),
    *((("peak_live",), v) for v in ["s", [], 5, {}]),
    *((("strings",), v) for v in ["s", None, {}, [1], [None]]),
    *((("sites",), v) for v in ["s", None, [5], [["f", "x", "g"]], [["f"]], [["f", -1, "g"]]]),
    # a version-2 site: [frame, detail, chain], indexes into "frames" (a version-1 row refused)
    *(
        (("sites",), v)
        for v in [
            [[0, -1]],
            [[0, -2, []]],
            [[10**6, -1, []]],
            [[0, 10**6, []]],
            [[0, -1, [10**6]]],
            [[0, -1, [-1]]],
            [[0, -1, "ab"]],
            [[0, -1, None]],
            [["f", 1, "g"]],
        ]
    ),
    *((("frames",), v) for v in ["s", None, [5], [["f", "x", "g"]], [["f"]], [["f", -1, "g"]]]),
    *(
        (("metas",), v)
        for v in [
            "s",
            None,
            [[0]],
            [[0, -2, [], 0]],
            [[0, -1, [-1], 0]],
            [[10**6, -1, [], 0]],
            [[0, -1, "ab", 0]],
            [[0, -1, [], -1]],
            [[0, 10**6, [], 0]],
            [[0, -1, [1.5], 0]],
        ]
    ),
    *((("placements",), v) for v in ["s", None, [5], [[5]], [[[0]]], [[[0, -5]]], [[[-1, 1]]]]),
    *((("stacks",), v) for v in ["s", 5, [5], [[10**6]], [["x"]], [[0, [["f", "x", "g"]]]]]),
    *((("names",), v) for v in ["s", 5, [5], [[1]], [["x", "n"]], [[1, 2]], [[-1, "n"]]]),
    *(
        (("marks",), v)
        for v in [
            "s",
            5,
            [5],
            [[1.0]],
            [[NAN, "m", None]],
            [[INF, "m", None]],
            [[-1.0, "m", None]],
            [["1", "m", None]],
            [[1.0, 5, None]],
            [[1.0, "m", -1]],
            [[1.0, "m", "64"]],
        ]
    ),
    *(
        (("oom",), v)
        for v in [
            "s",
            5,
            [],
            {},
            {"time": "x"},
            {"time": NAN},
            {"time": -1.0},
            {"time": 1.0, "what": 5},
            {"time": 1.0, "requested": "5"},
            {"time": 1.0, "requested": -1},
            {"time": 1.0, "called_at": 5},
        ]
    ),
    *((("events", "kind"), Each(v)) for v in _INDEXES),
    *((("events", "scope"), Each(v)) for v in _INDEXES),
    *((("events", "name"), Each(v)) for v in _INDEXES),
    *((("events", "meta"), Each(v)) for v in _INDEXES),
    *((("events", "placement"), Each(v)) for v in ["s", None, True, [], -2, 1.5, 10**6]),
    *((("events", "time"), Each(v)) for v in _TIMES),
    *((("base", "time"), Each(v)) for v in _TIMES),
    *((("peak_live", "time"), Each(v)) for v in _TIMES),
    *((("events", "time", 0), v) for v in (NAN, INF, -1.0)),
    *((("events", "bytes"), Each(v)) for v in _COUNTS),
    *((("events", "buffer"), Each(v)) for v in _COUNTS),
    *((("events", "tensors"), Each(v)) for v in [5, None, [], "x", "-1", "1,,2", "9" * 30]),
    *((("events", c), v) for c in ("kind", "time", "tensors") for v in ([], "s", None, DELETE)),
    *(
        ((k,), DELETE)
        for k in ("strings", "frames", "sites", "metas", "placements", "events", "base")
    ),
    *(((k,), DELETE) for k in ("max_events", "dropped", "peak_bytes", "peak_time")),
]


def _label(path: tuple, value: object) -> str:
    shown = "DELETE" if value is DELETE else repr(value)
    return ".".join(map(str, path)) + "=" + (shown if len(shown) < 30 else shown[:27] + "...")


@pytest.mark.parametrize(
    ("path", "value"), TIMELINE_MUTATIONS, ids=[_label(*m) for m in TIMELINE_MUTATIONS]
)
def test_a_malformed_timeline_is_one_line(good, tmp_path, capsys, path, value):
    bad = _mutated(good["timeline"], path, value)
    file = tmp_path / "in.json"
    file.write_text(json.dumps(bad))  # NaN and Infinity as Python writes them
    line = _refused(file, capsys)
    assert "malformed" in line or "a tidyjax timeline without" in line
    if path[0] == "oom":  # only `view` reads it: Timeline.load ignores it
        tj.Timeline.load(file)
    else:
        with pytest.raises(tj.TidyjaxValueError) as err:
            tj.Timeline.load(file)
        assert str(err.value) == line.removeprefix("tidyjax view: ")


def test_event_times_that_go_back_are_refused(good, tmp_path, capsys):
    bad = copy.deepcopy(good["timeline"])
    bad["events"]["time"].reverse()
    assert bad["events"]["time"] != good["timeline"]["events"]["time"]
    file = tmp_path / "in.json"
    file.write_text(json.dumps(bad))
    assert "before the event before it" in _refused(file, capsys)


@pytest.mark.parametrize("time", ["NaN", "Infinity", "-Infinity", "-1.5"])
def test_nan_infinite_or_negative_times_name_the_event(good, tmp_path, capsys, time):
    text = json.dumps(good["timeline"])
    first = repr(good["timeline"]["events"]["time"][0])
    assert text.count(first) >= 1
    file = tmp_path / "in.json"
    file.write_text(text.replace(first, time, 1))
    line = _refused(file, capsys)
    assert "event 0" in line and "time" in line


_TENSOR_FIELDS = {
    "id": ["s", -1, 1.5, True, None, 10**400, DELETE],
    "shape": ["s", None, [-1], [1.5], [True], ["1"], DELETE],
    "dtype": [1, None, [], {}, DELETE],
    "bytes": ["s", -1, 1.5, True, None, 2**63, DELETE],
    "devices": ["cpu", None, [1], [None], DELETE],
    "scope": [1, None, [], {}, DELETE],
    "site": [
        "s",
        5,
        [],
        {},
        {"file": "f"},
        {"file": 1, "line": 1, "function": "g"},
        {"file": "f", "line": "1", "function": "g"},
        {"file": "f", "line": -1, "function": "g"},
    ],
    "kept": ["yes", 1, 0, None, DELETE],
    "variable": ["yes", 1, 0, None, DELETE],
    "buffer": ["s", -1, 1.5, True, None],
    "name": [1, [], True],
}
SNAPSHOT_MUTATIONS = [
    *((("taken_at",), v) for v in ["s", None, True, [], -1.0, NAN, INF, 1e300, 10**400, DELETE]),
    *((("tensors",), v) for v in ["s", None, {}, 5, [5], ["x"], [None], DELETE]),
    *((("tensors", 0, f), v) for f, values in _TENSOR_FIELDS.items() for v in values),
]


@pytest.mark.parametrize(
    ("path", "value"), SNAPSHOT_MUTATIONS, ids=[_label(*m) for m in SNAPSHOT_MUTATIONS]
)
def test_a_malformed_snapshot_is_one_line(good, tmp_path, capsys, path, value):
    bad = _mutated(good["snapshot"], path, value)
    file = tmp_path / "in.json"
    file.write_text(json.dumps(bad))
    line = _refused(file, capsys)
    assert "malformed tidyjax snapshot" in line
    if len(path) == 3:  # the entry named, and the field where Snapshot.load does not
        assert "tensors[0]" in line


@pytest.mark.parametrize("kind", ["timeline", "snapshot"])
def test_random_damage_is_never_a_traceback(good, tmp_path, capsys, kind):
    """Seeded random edits of a valid file: drawn, or refused in one line; never raised."""
    text = json.dumps(good[kind])
    rng = random.Random(kind)
    file = tmp_path / "in.json"
    refused = 0
    for _ in range(150):
        chars = list(text)
        for _ in range(rng.randint(1, 4)):
            chars[rng.randrange(len(chars))] = rng.choice('[]{}",:-0123456789.eEnN ')
        file.write_text("".join(chars))
        status = cli.main(["view", str(file), "-o", str(tmp_path / "out.html")])
        err = capsys.readouterr().err.splitlines()
        assert status in (0, 2)
        if status == 2:
            refused += 1
            assert len(err) == 1 and err[0].startswith(f"tidyjax view: {file}"), err
    assert refused > 50


def test_in_a_subprocess_deep_nesting_and_nan_times_are_one_line(good, tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000)
    nan = tmp_path / "nan.json"
    nan.write_text(json.dumps(_mutated(good["timeline"], ("events", "time", 0), NAN)))
    for bad in (deep, nan):
        proc = run(str(bad))
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr
        assert len(proc.stderr.splitlines()) == 1 and str(bad) in proc.stderr


def test_timeline_load_refuses_deep_nesting_and_names_a_missing_version(good, tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000)
    with pytest.raises(tj.TidyjaxValueError, match="nested too deeply"):
        tj.Timeline.load(deep)
    with pytest.raises(tj.TidyjaxValueError, match='no "version"') as err:
        tj.Timeline.from_json(_mutated(good["timeline"], ("version",), DELETE), where="data")
    assert "Upgrade" not in str(err.value)


@pytest.mark.parametrize("stage", ["reading", "drawing"])
def test_what_a_check_misses_is_still_one_line(dumped, capsys, monkeypatch, stage):
    """Should a check let a bad value through, the error it causes is one line too."""

    def fail(*args: object, **kwargs: object) -> None:
        raise OverflowError("int too large to convert to float")

    monkeypatch.setattr(tj.Timeline, "from_json" if stage == "reading" else "to_html", fail)
    line = _refused(dumped, capsys)
    verb = "read" if stage == "reading" else "draw"
    assert f"cannot {verb} it (OverflowError: int too large" in line


# -- malformed snapshot files ---------------------------------------------------------------------


def _record(**change):
    d = {
        "id": 1, "shape": [2], "dtype": "float32", "bytes": 8, "devices": ["TFRT_CPU_0"],
        "scope": "", "site": None, "kept": False, "variable": False, "buffer": 1, "name": None,
    }  # fmt: skip
    d.update(change)
    return {k: v for k, v in d.items() if v is not ...}


def _snapshot_file(tmp_path, tensors, name="s.json", **top):
    data = {"format": "tidyjax.snapshot", "version": 1, "taken_at": 0.0, "tensors": tensors}
    data.update(top)
    data = {k: v for k, v in data.items() if v is not ...}
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def test_snapshot_load_of_a_malformed_file_raises_a_tidyjax_error(tmp_path):
    path = _snapshot_file(tmp_path, [_record(), _record(shape=...)])
    with pytest.raises(tj.TidyjaxValueError) as e:
        tj.Snapshot.load(path)
    assert str(e.value) == f'{path} is a malformed tidyjax snapshot: tensors[1] has no "shape".'
    cases = [
        (_snapshot_file(tmp_path, [1], "a.json"), r"malformed tidyjax snapshot: tensors\[0\]"),
        (_snapshot_file(tmp_path, [_record(bytes="8")], "b.json"), r"tensors\[0\]'s \"bytes\""),
        (_snapshot_file(tmp_path, [], "c.json", taken_at=...), 'it has no "taken_at"'),
        (_snapshot_file(tmp_path, [], "d.json", version=3), "format version 3"),
    ]
    (tmp_path / "e.json").write_text("[]")
    (tmp_path / "f.json").write_text("{not json")
    cases += [(tmp_path / "e.json", "not a tidyjax snapshot"), (tmp_path / "f.json", "not a JSON")]
    for file, message in cases:
        with pytest.raises(tj.TidyjaxValueError, match=message):
            tj.Snapshot.load(file)
    good = _snapshot_file(tmp_path, [_record()], "good.json")
    assert [r.shape for r in tj.Snapshot.load(good).records] == [(2,)]


def test_snapshot_load_checks_what_its_conversion_would_accept(tmp_path):
    # Values a conversion takes without a word (a device name as a string of devices, True as
    # a count, a number too large for a float) are refused, the field named, as the CLI does.
    cases = [
        (_snapshot_file(tmp_path, [_record(devices="cpu:0")], "a.json"),
         "tensors[0]'s \"devices\" is \"cpu:0\", not a list of str"),
        (_snapshot_file(tmp_path, [_record(kept=1)], "b.json"),
         "tensors[0]'s \"kept\" is 1, not true or false"),
        (_snapshot_file(tmp_path, [], "c.json", taken_at=10**400),
         "its \"taken_at\" is"),
    ]  # fmt: skip
    for file, message in cases:
        with pytest.raises(tj.TidyjaxValueError) as e:
            tj.Snapshot.load(file)
        assert str(e.value).startswith(f"{file} is a malformed tidyjax snapshot: {message}")


def test_view_of_a_malformed_snapshot_exits_2_with_one_line(tmp_path, capsys):
    path = _snapshot_file(tmp_path, [1])
    proc = subprocess.run(
        [sys.executable, "-m", "tidyjax", "view", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.splitlines() == [
        f"tidyjax view: {path} is a malformed tidyjax snapshot: tensors[0] is 1, not an object."
    ]
    assert not (tmp_path / "s.html").exists()
    bad = _snapshot_file(tmp_path, [_record(devices=5)], "bad.json")
    assert cli.main(["view", str(bad)]) == 2  # in process too: one line naming the file
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"tidyjax view: {bad} is a malformed tidyjax")
