"""ArrayMark.advance: the arrays made since the last look, the mark moved to now, one read of
``jax.live_arrays()`` per look and nothing rebuilt when nothing was made (a timeline looks at
every scope event). The rule itself (``new``) is tested in test_leaks_plain.py."""

from __future__ import annotations

import gc

import jax.numpy as jnp

from tidyjax import _newarrays
from tidyjax._newarrays import NEWEST, ArrayMark

from .conftest import walked_live_arrays


def _same(found: list[object], expected: list[object]) -> bool:
    return len(found) == len(expected) and all(x is y for x, y in zip(found, expected, strict=True))


def test_advance_lists_what_each_look_has_not_seen():
    mark = ArrayMark()
    assert mark.advance() == []
    a = jnp.ones(2)
    b = a + 1
    assert _same(mark.advance(), [b, a])  # newest first
    assert mark.advance() == []  # seen: the mark moved
    c = b * 2
    tmp = b * 3
    del tmp  # dead before the look: not listed
    d = jnp.zeros(3)
    d.delete()  # deleted: not listed
    assert _same(mark.advance(), [c])
    assert mark.advance() == [] and mark.new() == []
    del a, b, c  # the marked newest arrays die: the next made is still found
    e = jnp.full(4, 2.0)
    assert _same(mark.advance(), [e])


def test_advance_after_every_marked_array_died_falls_back_to_ids():
    # No collection meanwhile: an older array that dies after the mark could lend its id to a
    # new one, the fallback's documented blind spot.
    gc.collect()
    gc.disable()
    try:
        old = [jnp.full(2, i) for i in range(5)]
        mark = ArrayMark()
        temps = [jnp.zeros(1) for _ in range(NEWEST)]
        seen = mark.advance()  # the mark's newest are now exactly these temps
        assert {id(a) for a in temps} <= {id(a) for a in seen}
        del temps, seen  # all of them die
        made = [jnp.ones(3) for _ in range(NEWEST + 5)]  # may reuse their ids
        new = mark.advance()
        assert {id(a) for a in made} <= {id(a) for a in new}
        assert not {id(a) for a in new} & {id(a) for a in old}
        assert mark.advance() == []
    finally:
        gc.enable()


def test_a_look_with_nothing_new_reads_one_array_and_keeps_the_mark(monkeypatch):
    keep = [jnp.zeros(1) for _ in range(200)]
    mark = ArrayMark()
    (platform,) = mark._marks
    newest, older = platform.newest, platform.older
    seen = walked_live_arrays(monkeypatch)
    built = []
    monkeypatch.setattr(
        _newarrays._PlatformMark, "_set", lambda self, arrays: built.append(len(arrays))
    )
    for _ in range(5):
        assert mark.advance() == []
    assert seen == [] and built == []  # the first array was the one marked: nothing walked
    assert platform.newest is newest and platform.older is older
    fresh = jnp.ones(1)
    assert _same(mark.advance(), [fresh])
    assert len(seen) == 2 and len(built) == 1  # the new array and the newest old one; moved
    del keep


def test_a_new_array_reusing_a_dead_arrays_id_is_new_every_time():
    """Every array alive at the mark dies inside (a step replacing all of its state): the new
    ones often reuse the dead ones' ids, and the one leaked must be found every time (issue
    41: it was missed in 12 to 15 of 20 checks with ids alone)."""
    state = [jnp.full(4, float(i)) for i in range(200)]
    missed = 0
    for _ in range(20):
        mark = ArrayMark()
        for i in range(len(state)):  # every array at the mark dies, one at a time
            state[i] = state[i] + 1  # the next new array may take the dead one's id
        leaked = jnp.zeros(4)  # the one new array beyond the replaced state
        new = mark.new()
        missed += not any(a is leaked for a in new)
        assert len(new) == len(state) + 1
        del leaked, new
    assert missed == 0
    del state


def test_alive_at_mark_lists_the_arrays_alive_then_however_the_mark_moves():
    for count in (2, NEWEST + 4):  # the newest marked only, then the fallback's list of all
        old = [jnp.full(3, float(i)) for i in range(count)]
        mark = ArrayMark()
        at_mark = mark.alive_at_mark()
        new = jnp.ones(5)
        assert _same(mark.advance(), [new])  # moved: its own lists replaced
        alive = [a for ref in at_mark if (a := ref()) is not None]
        assert all(any(a is o for a in alive) for o in old)
        assert all(a is not new for a in alive)
        del old, new
