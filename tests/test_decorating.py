"""``_decorating``: one callable check, one sync-and-async decorator body."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import pytest

import tidyjax as tj
from tidyjax._decorating import check_callable, decorate


def _gen():
    yield 1


async def _agen():
    yield 1


@pytest.mark.parametrize("fn", [_gen, _agen], ids=["generator", "async generator"])
@pytest.mark.parametrize("make", [tj.check_leaks, tj.oom_report], ids=["check_leaks", "oom_report"])
def test_decorators_refuse_generator_functions_sync_and_async(make, fn):
    with pytest.raises(tj.TidyjaxTypeError, match="decorates a plain or async function, got"):
        make()(fn)


def test_one_wording_for_a_callable_check():
    for call, what in [(tj.lift, "lift()"), (tj.jit, "tidyjax.jit()"), (tj.profile, "profile()")]:
        with pytest.raises(tj.TidyjaxTypeError) as e:
            call(5)
        assert str(e.value).startswith(f"{what} takes a function or other callable, got int 5.")
    check_callable(_gen, "lift()")  # a generator function is a callable


def test_decorate_runs_each_call_inside_a_fresh_block_sync_and_async():
    log: list[object] = []

    @contextlib.contextmanager
    def block() -> Iterator[list[object]]:
        log.append("enter")
        yield log
        log.append("exit")

    def seen(entered: list[object], result: object) -> None:
        entered.append(result)

    def double(x: int) -> int:
        return 2 * x

    async def triple(x: int) -> int:
        return 3 * x

    assert decorate(double, block, "@block", seen)(2) == 4
    assert asyncio.run(decorate(triple, block, "@block", seen)(2)) == 6
    assert log == ["enter", 4, "exit", "enter", 6, "exit"]
    assert decorate(double, block, "@block").__name__ == "double"
