"""live_tensors, creation sites, snapshots and their diffs, check_leaks, the pytest plugin."""

from __future__ import annotations

import json
import os

import pytest

import tidyjax as tj
from tidyjax import tidy

from .conftest import line_of

# Sites name files relative to the working directory when they lie under it.
HERE = os.path.relpath(__file__)
HERE = __file__ if HERE.startswith(os.pardir) else HERE


def make_pair():
    return tj.tensor([1.0, 2.0]) * 2  # SITE:make_pair


def test_live_tensors_report_scope_site_kept_and_variable():
    a = make_pair()
    k = tj.keep(tj.tensor([0.0]))
    v = tj.Variable([1.0, 2.0, 3.0], name="v")
    with tidy("train"), tidy("step"):
        b = a + 1  # SITE:in_scope
        records = {r.id: r for r in tj.live_tensors()}
    ra, rb, rk, rv = records[a.id], records[b.id], records[k.id], records[v.id]
    assert (ra.shape, ra.dtype, ra.bytes, ra.scope) == ((2,), "float32", 8, "")
    assert ra.site.file == __file__ and ra.site.line == line_of("SITE:make_pair")
    assert ra.site.function == "make_pair"
    assert "test_inspect.py" in str(ra.site) and "in make_pair" in str(ra.site)
    assert rb.scope == "train/step" and rb.site.line == line_of("SITE:in_scope")
    assert rk.kept and rk.scope == "<kept>"
    assert rv.variable and rv.scope == "<variable>" and rv.bytes == 12
    assert ra.devices == ("cpu:0",) or ra.devices[0].startswith(("cpu", "TFRT"))
    tj.dispose([a, k, v])


def test_snapshot_compare_to_sorts_by_size_change_and_round_trips_json(tmp_path):
    before = tj.snapshot()
    grown = [make_pair() for _ in range(3)]
    big = tj.tensor([0.0] * 100)  # SITE:big
    after = tj.snapshot()
    diffs = after.compare_to(before)
    assert [d.bytes_diff for d in diffs] == [400, 24]
    assert str(diffs[0]).startswith(f"{HERE}:{line_of('SITE:big')} in test_snapshot")
    assert (diffs[1].count, diffs[1].count_diff) == (3, 3)
    assert "+24 B" in str(diffs[1])
    stats = after.statistics()
    assert stats[0].bytes == 400 and stats[1].shapes == {"float32[2]": 3}
    path = tmp_path / "snap.json"
    after.dump(path)
    data = json.loads(path.read_text())
    assert data["format"] == "tidyjax.snapshot" and data["version"] == 2
    assert {"id", "shape", "dtype", "bytes", "devices", "scope", "site", "kept", "variable"} <= set(
        data["tensors"][0]
    )
    loaded = tj.Snapshot.load(path)
    assert [str(d) for d in loaded.compare_to(before)] == [str(d) for d in diffs]
    tj.dispose([grown, big])
    shrink = tj.snapshot().compare_to(after)
    assert [d.count_diff for d in shrink] == [-1, -3]
    with pytest.raises(tj.TidyjaxTypeError, match="Snapshot"):
        after.compare_to(5)


def test_check_leaks_reports_the_right_file_and_line():
    with pytest.raises(tj.LeakError) as err, tj.check_leaks(count_locals=True):
        kept_by_mistake = make_pair()  # SITE:leak_call
    report = err.value.report
    assert len(report) == 1 and report.num_bytes == 8
    (group,) = report.groups
    # the outermost user frame inside the block; the helper that made it is its stack
    name = "test_check_leaks_reports_the_right_file_and_line"
    assert str(group.site) == f"{HERE}:{line_of('SITE:leak_call')} in {name}"
    # grouped by the chain of user frames, outer to inner (issue 41)
    chain = f"{HERE}:{line_of('SITE:leak_call')} in {name} → {HERE}:{line_of('SITE:make_pair')}"
    assert f"{chain} in make_pair: 1 tensor" in str(report)
    assert group.count == 1 and group.shapes == {"float32[2]": 1}
    assert "1 tensor (8 B) created inside check_leaks() is still alive" in str(err.value)
    assert isinstance(err.value, AssertionError)
    kept_by_mistake.dispose()


def test_check_leaks_allowances():
    with tj.check_leaks(allowance=1):
        one = make_pair()
    with tj.check_leaks() as checker:
        two = make_pair()
        checker.allow(two)
    with tj.check_leaks(allow_kept=True):
        three = tj.keep(make_pair())
    with tj.check_leaks():  # freed by a scope, dropped, or disposed: no leak
        with tidy():
            make_pair() + 1
        make_pair()
        tj.tensor([1.0]).dispose()

    @tj.check_leaks()
    def returns_one():
        tmp = make_pair()
        return tmp + 1

    four = returns_one()  # the return value is allowed

    @tj.check_leaks(allow_returned=False)
    def returns_again():
        return make_pair()

    with pytest.raises(tj.LeakError) as err:
        returns_again()
    assert len(err.value.report) == 1
    tj.dispose([one, two, three, four])
    with pytest.raises(tj.TidyjaxTypeError, match="allowance"):
        tj.check_leaks(allowance=-1)


def test_check_leaks_does_not_mask_the_blocks_own_error():
    with pytest.raises(KeyError), tj.check_leaks():
        leaked = make_pair()
        raise KeyError("own")
    leaked.dispose()


# -- the pytest plugin, run by pytest's own pytester -------------------------------------------

LEAKY_TESTS = """
import pytest
import tidyjax as tj

KEEP = []

def make():
    return tj.tensor([1.0, 2.0, 3.0])  # leaks from here

@pytest.mark.no_tensor_leaks
def test_leaky():
    KEEP.append(make())

@pytest.mark.no_tensor_leaks
def test_clean():
    with tj.tidy():
        make() * 2

@pytest.mark.no_tensor_leaks(allowance=1)
def test_allowed():
    KEEP.append(make())

def test_unmarked_leak():
    KEEP.append(make())

def test_fixture_scope(tidy_scope):
    t = make()
    assert tidy_scope.path == "test"
    KEEP.append(t)  # freed by the fixture's scope at teardown, though referenced

def test_after_fixture():
    assert KEEP[-1].is_disposed
"""


def test_plugin_marker_fails_a_leaking_test_with_a_grouped_report(pytester):
    pytester.makepyfile(test_leaks=LEAKY_TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=5, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*test_leaky*",
            "*1 tensor (12 B) created inside test test_leaky is still alive:*",
            "*test_leaks.py:11 in test_leaky → test_leaks.py:7 in make: "
            "1 tensor, 12 B [[]float32[[]3[]][]]*",
        ]
    )


def test_plugin_prints_a_leak_report_once(pytester):
    pytester.makepyfile(test_leaks=LEAKY_TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-k", "test_leaky")
    result.assert_outcomes(failed=1, deselected=5)
    report = [ln for ln in result.stdout.lines if "is still alive" in ln]
    assert len([ln for ln in report if not ln.startswith("FAILED")]) == 1  # + pytest's summary


def test_plugin_bad_allowance_fails_the_test_with_a_clear_message(pytester):
    pytester.makepyfile(
        test_bad="""
import pytest

@pytest.mark.no_tensor_leaks(allowance="x")
def test_bad():
    pass
"""
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*no_tensor_leaks(allowance=...) takes a number of Tensors*'x'*"])
    assert "ValueError" not in result.stdout.str()


def test_plugin_flag_applies_to_every_test(pytester):
    pytester.makepyfile(test_leaks=LEAKY_TESTS)
    result = pytester.runpytest_subprocess("--tidyjax-leaks", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=4, failed=2)  # test_unmarked_leak fails too
    result.stdout.fnmatch_lines(["*FAILED*test_unmarked_leak*"])


def test_plugin_ini_setting_and_allowance(pytester):
    pytester.makepyfile(test_leaks=LEAKY_TESTS)
    pytester.makeini("[pytest]\ntidyjax_leaks = true\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=4, failed=2)
    pytester.makeini("[pytest]\ntidyjax_leaks = true\ntidyjax_leak_allowance = 1\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=6)  # one leak each is allowed by default now
