"""Every public boolean keyword of tidyjax takes ``True``/``False`` (or a NumPy bool) and refuses
anything else with a `TidyjaxTypeError` naming the function, the argument and what it got:
``memory(all_processes="yes")`` must not read as true, nor ``arrays=0`` as false."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import tidyjax as tj

Call = Callable[[Any, Any], object]


def _variable(value: Any, tmp_path: Any) -> object:
    v = tj.Variable(np.zeros(2, np.float32), trainable=value)
    trainable = v.trainable
    v.dispose()
    return trainable


#: (the public name, the argument) -> (the name its errors give, a call passing ``value``)
FLAGS: dict[tuple[str, str], tuple[str, Call]] = {
    ("memory", "scan_untracked"): ("memory()", lambda v, _: tj.memory(scan_untracked=v)),
    ("memory", "all_processes"): ("memory()", lambda v, _: tj.memory(all_processes=v)),
    ("live_tensors", "untracked"): ("live_tensors()", lambda v, _: tj.live_tensors(untracked=v)),
    ("snapshot", "untracked"): ("snapshot()", lambda v, _: tj.snapshot(untracked=v)),
    ("check_leaks", "allow_returned"): (
        "check_leaks()", lambda v, _: tj.check_leaks(allow_returned=v).allow_returned,
    ),
    ("check_leaks", "allow_kept"): (
        "check_leaks()", lambda v, _: tj.check_leaks(allow_kept=v).allow_kept,
    ),
    ("check_leaks", "arrays"): ("check_leaks()", lambda v, _: tj.check_leaks(arrays=v).arrays),
    ("budget", "per_device"): (
        "tidyjax.budget()", lambda v, _: tj.budget(2**30, per_device=v).per_device,
    ),
    ("check_leaks", "count_locals"): (
        "check_leaks()", lambda v, _: tj.check_leaks(count_locals=v).count_locals,
    ),
    ("check_leaks", "count_numpy_views"): (
        "check_leaks()", lambda v, _: tj.check_leaks(count_numpy_views=v).count_numpy_views,
    ),
    ("check_leaks", "all_processes"): (
        "check_leaks()", lambda v, _: tj.check_leaks(all_processes=v).all_processes,
    ),
    ("timeline", "arrays"): ("timeline()", lambda v, _: tj.timeline(arrays=v).arrays),
    ("Timeline", "arrays"): ("Timeline()", lambda v, _: tj.Timeline(arrays=v).arrays),
    ("Timeline.to_chrome_trace", "buffers"): (
        "Timeline.to_chrome_trace()",
        lambda v, tmp: tj.Timeline().to_chrome_trace(tmp / "trace.json", buffers=v),
    ),
    ("Variable", "trainable"): ("Variable()", _variable),
}  # fmt: skip

NOT_BOOLS = ["yes", "", "False", 1, 0, 1.0, None, [], np.array(True), np.int64(1), np.True_ + 0]
BOOLS = [True, False, np.True_, np.bool_(False)]


@pytest.mark.parametrize("value", NOT_BOOLS, ids=repr)
@pytest.mark.parametrize("flag", list(FLAGS), ids=lambda f: f"{f[0]}({f[1]}=)")
def test_a_flag_that_is_not_a_bool_is_refused(flag, value, tmp_path):
    where, call = FLAGS[flag]
    with pytest.raises(tj.TidyjaxTypeError) as err:
        call(value, tmp_path)
    message = str(err.value)
    assert isinstance(err.value, TypeError)
    assert message.startswith(f"{where}'s {flag[1]} must be True or False, got ")
    assert type(value).__name__ in message and repr(value)[:20] in message
    assert "\n" not in message


@pytest.mark.parametrize("value", BOOLS, ids=repr)
@pytest.mark.parametrize("flag", list(FLAGS), ids=lambda f: f"{f[0]}({f[1]}=)")
def test_a_bool_or_a_numpy_bool_is_taken(flag, value, tmp_path):
    _, call = FLAGS[flag]
    result = call(value, tmp_path)
    if type(result) in (bool, np.bool_):  # the flag as kept: a plain bool, whatever was given
        assert type(result) is bool and result == bool(value)


def test_every_boolean_keyword_of_the_public_api_is_checked():
    """Each parameter annotated ``bool`` of a public function, class or method exported by
    ``tidyjax`` is in FLAGS (a new flag needs its check, and its row here)."""
    records = {"TensorRecord", "SiteStat", "MemoryInfo"}  # data: their fields are no options
    found = set()
    for name in tj.__all__:
        obj = getattr(tj, name)
        if name in records or not callable(obj):
            continue
        targets = [(name, obj)]
        if inspect.isclass(obj):
            init = obj.__new__ if "__new__" in vars(obj) else obj.__init__
            targets = [(name, init)]
            targets += [
                (f"{name}.{attr}", fn)
                for attr, fn in vars(obj).items()
                if not attr.startswith("_") and inspect.isfunction(fn)
            ]
        for qualified, fn in targets:
            try:
                params = inspect.signature(fn).parameters.values()
            except (TypeError, ValueError):  # a builtin without a signature
                continue
            found |= {(qualified, p.name) for p in params if p.annotation in ("bool", bool)}
    assert found == set(FLAGS)


def test_setting_trainable_takes_a_flag_only() -> None:
    v = tj.Variable(tj.tensor([1.0]))
    with pytest.raises(tj.TidyjaxTypeError, match="trainable must be True or False"):
        v.trainable = "no"  # type: ignore[assignment]
    assert v.trainable is True
    v.trainable = np.False_  # type: ignore[assignment]
    assert v.trainable is False
    v.dispose()


@pytest.mark.parametrize("value", [True, False, -1, 1.5, "2", None, np.True_], ids=repr)
def test_check_leaks_allowance_is_a_count(value):
    with pytest.raises(
        tj.TidyjaxTypeError, match=r"check_leaks\(\)'s allowance must be an int >= 0"
    ):
        tj.check_leaks(allowance=value)


@pytest.mark.parametrize("value", [0, np.int64(2)], ids=repr)
def test_check_leaks_takes_a_count_of_any_integer_type(value):
    checker = tj.check_leaks(allowance=value)
    assert checker.allowance == int(value) and type(checker.allowance) is int


@pytest.mark.parametrize("value", [0, -1.0, float("nan"), True, "30", None], ids=repr)
@pytest.mark.parametrize("where", ["memory()", "check_leaks()"])
def test_a_timeout_is_a_positive_number_of_seconds(where, value):
    call = {"memory()": tj.memory, "check_leaks()": tj.check_leaks}[where]
    with pytest.raises(
        tj.TidyjaxTypeError, match=rf"{where[:-2]}\(\)'s timeout must be a number of seconds > 0"
    ):
        call(timeout=value)
    assert call(timeout=np.float32(0.5)) is not None
