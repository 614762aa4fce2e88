"""The ``jax.Array``s made since a mark: ``mark = ArrayMark()``, later ``mark.new()``.

The rule. ``jax.live_arrays()`` (public JAX) lists a backend's live arrays newest first. A mark
keeps weak references to the few newest arrays alive at the mark (``NEWEST`` per platform of the
local devices). ``new()`` walks each platform's list from the front and stops at the first array
that is one of those, still alive: everything before it was made after the mark, everything
after it existed then. So with nothing new made, ``new()`` looks at one array per platform:
its cost in Python is proportional to the new arrays (``jax.live_arrays()`` itself builds its
list in C++, about 0.05 µs per live array).

When every one of those newest arrays has died (temporaries made just before the mark), the
mark falls back to weak references to all arrays alive at the mark, taken when it was made: an
array is old exactly when one of them still resolves to it. An id alone never decides (a new
array may reuse the id of one that died after the mark), and the mark keeps nothing alive.

Deleted arrays are never listed. Arrays of a platform without local devices are not seen.
Imports nothing of tidyjax.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Iterator
from typing import Any

import jax

__all__ = ["NEWEST", "ArrayMark"]

#: How many of the newest arrays alive at a mark it references weakly, per platform.
NEWEST = 16


def _platforms() -> list[str]:
    return sorted({d.platform for d in jax.local_devices()})


class _PlatformMark:
    """One platform's part of a mark: weak references to its newest arrays, and the ids of
    all its arrays when there are more (the fallback)."""

    __slots__ = ("newest", "older", "platform")

    def __init__(self, platform: str) -> None:
        self.platform = platform
        self._set(jax.live_arrays(platform))

    def _set(self, arrays: list[Any]) -> None:
        """Mark the moment ``arrays`` (a live-array list, newest first) was read."""
        self.newest = [(id(a), weakref.ref(a)) for a in arrays[:NEWEST]]
        # A list, not a dict: the fallback is rare, and it builds its lookup then.
        self.older = list(map(weakref.ref, arrays)) if len(arrays) > NEWEST else None

    def new(self) -> list[Any]:
        # the list holds them: no marked array dies meanwhile
        return self._scan(jax.live_arrays(self.platform))[0]

    def advance(self) -> list[Any]:
        arrays = jax.live_arrays(self.platform)
        if arrays:  # the newest array still the one marked: nothing made since (most looks)
            first, newest = arrays[0], self.newest
            if newest and id(first) == newest[0][0] and newest[0][1]() is first:
                return []
        out, moved = self._scan(arrays)
        if moved:  # else the mark stands as it is: the same newest arrays, all alive
            self._set(arrays)
        return out

    def _scan(self, arrays: list[Any]) -> tuple[list[Any], bool]:
        """The arrays of ``arrays`` made after the mark, and whether the mark must move (an
        array was made since, or one of the newest marked died)."""
        newest = self.newest
        if not arrays:  # nothing alive, so nothing new
            return [], bool(newest)
        first = arrays[0]
        if newest and id(first) == newest[0][0] and newest[0][1]() is first:
            return [], False  # the newest array is still the one marked: nothing made since
        alive = {i for i, ref in newest if (a := ref()) is not None and not a.is_deleted()}
        if alive:  # the fast path: stop at the newest array that existed at the mark
            out: list[Any] = []
            for a in arrays:
                if id(a) in alive:
                    return out, len(alive) < len(newest) or a is not arrays[0]
                if not a.is_deleted():
                    out.append(a)
        # Every newest array died: the weak references to all arrays at the mark decide.
        older = {id(a) for ref in self.older or () if (a := ref()) is not None}
        found = [a for a in arrays if not a.is_deleted() and id(a) not in older]
        return found, True


class ArrayMark:
    """A point in time; `new` lists the live ``jax.Array``s created after it.

    ```python
    mark = ArrayMark()
    step()
    leaked = mark.new()      # newest first; arrays made by every thread count
    ```

    Making a mark reads ``jax.live_arrays()`` once per platform; `new` costs, in Python,
    one step per array made since (see the module docstring for the rule). `advance` does what
    ``new()`` then a fresh mark would, reading the arrays once, and keeps the mark as it is
    when nothing was made since (a timeline looks at each scope event).
    """

    __slots__ = ("_marks", "_one")

    def __init__(self) -> None:
        self._marks = [_PlatformMark(p) for p in _platforms()]
        self._one = self._marks[0] if len(self._marks) == 1 else None

    def advance(self) -> list[Any]:
        """`new`'s arrays, and the mark moved to now: the next call lists those made after
        this one. Only the arrays made since are walked (and, when one of the newest marked
        arrays died, the ids of the arrays alive taken again)."""
        one = self._one
        if one is not None:
            return one.advance()
        out: list[Any] = []
        for mark in self._marks:
            out += mark.advance()
        return out

    def alive_at_mark(self) -> Iterator[weakref.ref[Any]]:
        """Weak references to every array alive when the mark was made or last moved, to read
        at leisure (moving the mark later replaces its lists: these stay as they were)."""
        parts = [m.older if m.older is not None else [r for _, r in m.newest] for m in self._marks]
        return itertools.chain.from_iterable(parts)

    def new(self) -> list[Any]:
        """The live, not deleted ``jax.Array``s created after the mark, newest first per platform.

        A typed PRNG key is listed as its key data array (as ``jax.live_arrays()`` lists it).
        """
        out: list[Any] = []
        for mark in self._marks:
            out += mark.new()
        return out
