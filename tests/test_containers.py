"""What a scope's exit, ``keep`` and ``dispose`` walk: registered pytrees, and the containers
Python users return that JAX does not flatten (``dict``/``list`` subclasses, ``deque``,
``OrderedDict`` subclasses, any ``Mapping`` or ``Sequence``, NumPy object arrays), as TF.js walks
what a scope returns. Nothing is ever freed silently: a result that cannot be walked frees
nothing and says so."""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

import tidyjax as tj
from tidyjax._context import CURRENT
from tidyjax._trees import gather_values


class DictSub(dict):  # type: ignore[type-arg]
    pass


class ListSub(list):  # type: ignore[type-arg]
    pass


class OrderedSub(collections.OrderedDict):  # type: ignore[type-arg]
    pass


class ReadOnly(Mapping):  # type: ignore[type-arg]
    def __init__(self, **items: Any) -> None:
        self._items = items

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)


def _object_array(t: tj.Tensor) -> Any:
    out = np.empty(2, dtype=object)
    out[0], out[1] = t, "label"
    return out


CONTAINERS: dict[str, Callable[[tj.Tensor], Any]] = {
    "dict subclass": lambda t: DictSub(a=t),
    "list subclass": lambda t: ListSub([t]),
    "deque": lambda t: collections.deque([t]),
    "OrderedDict subclass": lambda t: OrderedSub(a=t),
    "Mapping": lambda t: ReadOnly(a=t),
    "NumPy object array": _object_array,
    "nested": lambda t: [DictSub(x=collections.deque([t]))],
}


def _first(c: Any) -> tj.Tensor:
    tensors: list[tj.Tensor] = []
    gather_values(c, tensors, None)  # the walker scopes, keep and dispose use
    assert len(tensors) == 1
    return tensors[0]


@pytest.mark.parametrize("make", CONTAINERS.values(), ids=CONTAINERS.keys())
def test_returned_container_keeps_its_tensors(make: Callable[[tj.Tensor], Any]) -> None:
    out = tj.tidy.run(lambda: make(tj.tensor([1.0, 2.0])))
    t = _first(out)
    assert not t.is_disposed
    np.testing.assert_array_equal(t.numpy(), [1.0, 2.0])
    assert tj.memory().num_tensors == 1
    tj.dispose(out)  # dispose walks the same containers
    assert t.is_disposed and tj.memory().num_bytes == 0


@pytest.mark.parametrize("make", CONTAINERS.values(), ids=CONTAINERS.keys())
def test_decorated_function_returning_a_container(make: Callable[[tj.Tensor], Any]) -> None:
    @tj.tidy
    def build() -> Any:
        tmp = tj.tensor([5.0]) * 2  # freed at the exit
        del tmp
        return make(tj.tensor([1.0, 2.0]))

    out = build()
    assert not _first(out).is_disposed
    tj.dispose(out)


@pytest.mark.parametrize("make", CONTAINERS.values(), ids=CONTAINERS.keys())
def test_keep_of_a_container_keeps_its_tensors(make: Callable[[tj.Tensor], Any]) -> None:
    with tj.tidy():
        c = make(tj.tensor([1.0, 2.0]))
        assert tj.keep(c) is c
    t = _first(c)
    assert not t.is_disposed
    tj.dispose(c)
    assert t.is_disposed


def test_keep_of_an_empty_container_subclass_is_fine() -> None:
    assert tj.keep(DictSub()) == {}
    assert list(tj.keep(collections.deque())) == []


def test_dispose_never_deletes_a_plain_array_tidyjax_never_made() -> None:
    mine = jnp.ones(3)
    t = tj.tensor([1.0])
    tj.dispose({"mine": mine, "t": t})
    assert t.is_disposed
    assert not mine.is_deleted()
    np.testing.assert_array_equal(np.asarray(mine), [1.0, 1.0, 1.0])


def test_dispose_still_deletes_an_escaped_raw_array() -> None:
    # A raw array over a buffer tidyjax made (the Tensor's object, no Tensor holding it).
    with tj.tidy() as s:
        raw = s.keep(tj.tensor([1.0, 2.0]).array)
    assert tj.memory().num_bytes == 8
    tj.dispose(raw)
    assert raw.is_deleted() and tj.memory().num_bytes == 0


class Exploding:
    """An object whose attributes raise when a walk reads them."""

    def __init__(self, t: tj.Tensor, error: BaseException) -> None:
        self.t = t
        self._error = error

    @property
    def __dict__(self) -> Any:  # type: ignore[override]
        raise self._error


def test_a_result_walk_that_raises_frees_nothing_and_says_so() -> None:
    made: list[tj.Tensor] = []

    def f() -> Any:
        t = tj.tensor([1.0, 2.0])
        made.append(t)
        return Exploding(t, RuntimeError("boom"))

    with tj.tidy() as outer:
        with pytest.raises(tj.TidyjaxTypeError, match="could not walk the Exploding") as info:
            tj.tidy.run(f)
        assert isinstance(info.value.__cause__, RuntimeError)
        assert "Nothing was freed" in str(info.value)
        assert not made[0].is_disposed  # nothing lost...
        assert made[0]._rec.scope is outer  # ...and owned by a live scope, not a dead one
    assert made[0].is_disposed  # the enclosing scope freed it
    assert CURRENT.get() is None


def test_a_keyboard_interrupt_as_a_scope_exits_leaves_no_scope_open() -> None:
    made: list[tj.Tensor] = []

    def f() -> Any:
        t = tj.tensor([1.0])
        made.append(t)
        return Exploding(t, KeyboardInterrupt())

    with pytest.raises(KeyboardInterrupt):
        tj.tidy.run(f)
    assert CURRENT.get() is None
    assert not made[0].is_disposed
    assert made[0]._rec.scope is None  # no scope around: like a Tensor made outside any
    made[0].dispose()
    assert tj.memory().num_bytes == 0


def test_dispose_of_a_tensor_and_its_own_raw_array_together() -> None:
    t = tj.tensor([1.0, 2.0])
    raw = t.array
    tj.dispose([t, raw])  # every holder of the buffer is in the call: nothing left to refuse
    assert t.is_disposed and raw.is_deleted()
    u = tj.tensor([3.0])
    other = u.clone()
    with pytest.raises(tj.TidyjaxValueError, match="1 live Tensor"):
        tj.dispose([u, u.array])  # `other` still holds it: refused, nothing disposed
    assert not u.is_disposed
    tj.dispose([u, other])
    assert tj.memory().num_bytes == 0
