"""A randomized model of aliasing: random programs make array objects over one device
allocation in every form JAX makes them, and a model checks the rules of docs/semantics.md after
every step.

A program is a tree of steps, drawn whole before it runs: make a fresh Tensor (on one device,
replicated over eight, or a PRNG key), make the caller's own plain array (outside every scope),
open a nested scope (a with-block, ``__enter__``/``__exit__`` by hand, or ``tidy.run``; at most
three deep) and close it handing out some values (returned, or ``scope.keep``), make an alias of
a live holder's buffer (``jax.device_put`` of a Tensor or of a raw array to the same device,
``tensors``, ``addressable_data``, ``addressable_shards``, ``clone``, ``to`` a device or a
one-device ``NamedSharding``, ``key_data``; with eight devices also shard 0 of a replicated
array and ``to`` an eight-device ``NamedSharding``; ``jax.dlpack.from_dlpack`` only with
``TIDYJAX_ALIAS_DLPACK=1``, see ``DLPACK``), ``keep`` (``tidyjax.keep`` or an open
scope's ``keep``) or make a ``Variable`` of any live value, ``dispose`` a Tensor, or drop a
holder and collect garbage.

The model identifies an allocation by the ``(device id, address)`` of each shard, read when a
holder is made, and knows which holders are *protected*: handed out of the scope being closed
(to an open scope), kept, a live Variable, made in a scope still open or outside every scope, or
the caller's own array (never deleted). After every step it asserts:

1. no protected holder's array is deleted, nor an array whose allocations protected holders all
   reach, except by ``dispose`` of the last live Tensor over it, which deletes the buffer and
   every alias of it unless a kept value shares it (never the caller's own array; a kept
   shard view the program dropped is still kept while JAX caches it on its parent);
2. when a scope closes, every array over buffers made in it (or handed to it) that nothing
   protected reaches is deleted, every shard of it. Exempt: a buffer only partly shared with a
   protected holder (released rather than deleted, at the exit or by a ``dispose``), and the
   one alias tidyjax cannot see (a raw alias it never met, whose Tensors and recorded arrays
   are all gone first: the caller's then);
3. a scope disposes the Tensor objects it made (or was handed) and did not hand out, no other
   (TensorFlow.js's rule); ``dispose`` of the last live Tensor over a buffer tidyjax made
   deletes it;
4. the reports agree: ``memory()`` counts exactly the live Tensors the model knows (as
   ``live_tensors()`` and ``snapshot()`` list them), its bytes and buffers are theirs (each
   buffer once), and its buffers lie between the number of alias groups holding a live Tensor
   and the number of alias groups alive.

At the end of each example everything is disposed and ``memory()`` shows nothing. A failing
example's notes form a script that runs it again. The last test runs this file again under
eight host devices.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
import pytest
from hypothesis import Phase, given, note, settings
from hypothesis import strategies as st
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import tidyjax as tj

from .conftest import UNDER_EIGHT, run_under_eight_devices

# The model runs in every test run, on one device and (below) under eight host devices, on a
# fixed set of programs (derandomized: the same 120 each run); TIDYJAX_ALIAS_MODEL=1 draws new
# ones (seeds 1-18 on one device and 22-30 under eight passed; every form found has
# its own test in test_shared_allocations.py). TIDYJAX_ALIAS_SCRIPT=FILE appends each failing
# program there as a script (a flaky replay prints no notes).
# Until the tenth session the run under eight devices got no seed: each drew other programs, so
# "seed N passes there" meant one random run passed (the "flaky seed 9" was that); it gets
# --hypothesis-seed now. On JAX older than 0.10 it was opt-in under eight devices until the
# fifteenth session: random programs end with a buffer left in the books there (found in the
# sixth session; see the end of this note). Seed 8's
# "buffer left" was not that: a replicated copy kept into its source's scope lost seven shards
# (test_shared_allocations.py; its dumped script had passed alone because a partly deleted
# array reads as deleted). Eleventh session: seeds 1-35 on one device and under eight; 22 (one
# device, a raw alias of a Variable's buffer returned from a scope) and 27 under eight (a
# view of an heir's shard, disposed last, was released, not deleted) failed on the session's
# starting code and pass now (test_shared_allocations.py). Twelfth session: seeds 36-72 on one
# device and under eight; 41 (scope.keep of a Tensor whose Variable let go later) and 60 (a
# tensors() view resolved while its buffer's Tensor was collected) on one device failed on the
# session's starting code and pass now (test_variable.py, test_shared_allocations.py). Seed 72
# under eight devices failed on the fail-safe side: disposing ``tj.tensors([v])``, the last live
# Tensor over a buffer left to raw views tidyjax never met (``v`` one of them), left it. A gap
# of the model, confirmed in the fourteenth session: a top-level Tensor's buffer whose alias
# Tensors a scope disposed (as objects: not its buffer) is the caller's plain array from then on
# (``memory()`` counts it untracked, on one device as on eight), and ``tensors()`` wraps a
# caller's array without taking it; the model made such a buffer "orphan" only after a drop.
# It does so after a scope's exit and a dispose too (`Model.orphans`): seed 72 under eight, and
# seeds 73-98 on one device and under eight, pass. Fifteenth session: on JAX 0.6.2 under eight
# devices the fixed programs pass (they run there too now, in CI's wheel stage), as do random
# seeds 2, 5-7, 10 and 12; seeds 3, 8, 9, 11 and 13 still end with one buffer left in the
# books (seed 3 shrunk: a kept raw shard view of a Variable's buffer, disposed last with the
# other raw views, leaves it kept; fail-safe, not deleted; it does not happen on JAX 0.10.2,
# where a one-device array's ``addressable_shards[0].data`` is the array itself). On JAX 0.10.2,
# seeds 105-119 on eight devices (105-111 on one): 109 under eight deleted the caller's own
# replicated array, in three forms around a copy made over one of its shards (a raw view's
# ``tensors()`` moved to a replicated sharding): tests in test_shared_allocations.py, fixed.
RANDOM = bool(os.environ.get("TIDYJAX_ALIAS_MODEL"))

DEVS = jax.devices()
DEV0 = DEVS[0]
EIGHT = len(DEVS) >= 8
MESH1 = NamedSharding(Mesh(np.array(DEVS[:1]), ("x",)), P())
MESH8 = NamedSharding(Mesh(np.array(DEVS[:8]), ("x",)), P()) if EIGHT else None
# ``jax.dlpack.from_dlpack(t.array)`` works on JAX 0.10.2 (a view with a runtime buffer of its
# own over the same memory), but deleting two array objects over a buffer while such a view
# lives aborts the process (``Check failed: holds_[i] == 0 ... Non-zero type 1 hold on
# destruction``) with no tidyjax involved: ``a = x.addressable_data(0);
# d = jax.dlpack.from_dlpack(x); x.delete(); a.delete()``. Off unless asked for.
DLPACK = bool(os.environ.get("TIDYJAX_ALIAS_DLPACK"))
#: A file each failing program is appended to as a script that runs it again.
SCRIPT = os.environ.get("TIDYJAX_ALIAS_SCRIPT")

Key = tuple[int, int]  # one allocation: (device id, address)
Unit = tuple[Key, int]  # an allocation and the runtime buffer object over it (DLPack: another)
Owner = int | str  # a scope's serial, TOP, or one of the names below
Step = tuple[Any, ...]  # (kind, i, j, k) or ("scope", style, steps, handed out)

TOP = -1  # made outside every scope
KEPT = "kept"  # tidyjax.keep
VAR = "variable"  # a live Variable
USER = "user"  # the caller's own array, made outside every scope: never deleted
CLOSED = "closed"  # made in (or handed to) a scope that exited without handing it out
AMBIGUOUS = "ambiguous"  # a kept Tensor disposed while aliases live: no rule says more

MAX_DEPTH = 3
LEAVES = [
    *["fresh"] * 3,
    "key",
    "user",
    *["alias"] * 5,
    *["keep"] * 2,
    "variable",
    *["dispose"] * 2,
    *["drop"] * 2,
]
_INT = st.integers(0, 255)  # picks among what exists when the step runs (modulo)
_LEAF = st.tuples(st.sampled_from(LEAVES), _INT, _INT, _INT)


def _steps(depth: int) -> st.SearchStrategy[list[Step]]:
    """A block of steps; a scope holds a block of its own, up to ``MAX_DEPTH`` deep."""
    step: st.SearchStrategy[Step] = _LEAF
    if depth < MAX_DEPTH:
        scope = st.tuples(
            st.just("scope"),
            st.sampled_from(["with", "enter", "run"]),
            _steps(depth + 1),
            st.lists(_INT, max_size=3),
        )
        step = st.integers(0, 5).flatmap(lambda n: scope if n == 5 else _LEAF)
    return st.lists(step, min_size=8 if depth == 0 else 0, max_size=40 if depth == 0 else 8)


#: The first note of a program: with the notes after it, a script that runs it again.
PREAMBLE = """import gc, jax, numpy as np
import tidyjax as tj
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
devices = jax.devices(); dev0 = devices[0]  # {devices} devices; reports after every step: {eager}
mesh1 = NamedSharding(Mesh(np.array(devices[:1]), ("x",)), P())
mesh8 = NamedSharding(Mesh(np.array(devices[:8]), ("x",)), P()) if len(devices) >= 8 else None
h = {{}}


def K(x):  # reads its allocations, as the model does
    a = x.array if isinstance(x, tj.Tensor) else x
    [s.data.unsafe_buffer_pointer() for s in a.addressable_shards]
    return x


def R():  # the reports, as the model reads them after every step
    tj.memory(scan_untracked=False), tj.live_tensors(), tj.snapshot(untracked=False)"""


@dataclass(eq=False)
class Holder:
    """A value the program holds: a Tensor (Variables included) or a raw array."""

    hid: int
    obj: Any  # the Tensor or the raw array
    arr: Any  # its jax.Array, read when it was made
    keys: frozenset[Key]
    units: frozenset[Unit]
    tensor: bool
    owner: Owner
    made_in: int  # the scope it was made in (its serial) or TOP
    how: str
    shards: tuple[Any, ...] = ()  # per-shard views of a multi-device array
    dlpack: bool = False  # a DLPack view, or made from one
    seen: bool = False  # an array object tidyjax records (a Tensor's, or a raw one it met)
    kept: bool = False
    disposed: bool = False  # the model's expectation for a Tensor object
    dead: bool = False  # its array was deleted
    released: bool = False  # over a buffer a scope released: only dropped from now on

    @property
    def name(self) -> str:
        return f"h[{self.hid}]"

    @property
    def array_expr(self) -> str:
        return f"{self.name}.array" if self.tensor else self.name

    def fully_deleted(self) -> bool:
        return bool(self.arr.is_deleted()) and all(s.is_deleted() for s in self.shards)


def _keys(arr: Any) -> frozenset[Key]:
    return frozenset((s.device.id, s.data.unsafe_buffer_pointer()) for s in arr.addressable_shards)


def _undeleted(ref: weakref.ref[Any]) -> bool:
    arr = ref()
    return arr is not None and not arr.is_deleted()


def _is_key(arr: Any) -> bool:
    return bool(jax.dtypes.issubdtype(arr.dtype, jax.dtypes.prng_key))


def _raw(h: Holder) -> Any:
    return h.obj.array if h.tensor else h.obj


def _tensors_alias(h: Holder) -> Any:
    (out,) = tj.tensors([jax.device_put(_raw(h), DEV0) if h.tensor else h.obj])
    return out


# name -> (the expression the notes show, the operation)
ALIASES: dict[str, tuple[str, Callable[[Holder], Any]]] = {
    "put": ("jax.device_put({t}, dev0)", lambda h: jax.device_put(h.obj, DEV0)),
    "put_raw": ("jax.device_put({a}, dev0)", lambda h: jax.device_put(_raw(h), DEV0)),
    "tensors": ("tj.tensors([jax.device_put({a}, dev0)])[0]", _tensors_alias),
    "addressable_data": ("{a}.addressable_data(0)", lambda h: _raw(h).addressable_data(0)),
    "addressable_shards": (
        "{a}.addressable_shards[0].data",
        lambda h: _raw(h).addressable_shards[0].data,
    ),
    "clone": ("{t}.clone()", lambda h: h.obj.clone()),
    "to_device": ("{t}.to(dev0)", lambda h: h.obj.to(DEV0)),
    "to_mesh1": ("{t}.to(mesh1)", lambda h: h.obj.to(MESH1)),
    "to_mesh8": ("{t}.to(mesh8)", lambda h: h.obj.to(MESH8)),
    "key_data": ("jax.random.key_data({a})", lambda h: jax.random.key_data(_raw(h))),
    "dlpack": ("jax.dlpack.from_dlpack({a})", lambda h: jax.dlpack.from_dlpack(_raw(h))),
}


def _alias_kinds(h: Holder) -> list[str]:
    kinds = ["put_raw", "tensors", "addressable_data", "addressable_shards"]
    if h.tensor:
        kinds += ["put", "clone", "to_device", "to_mesh1"]
        if EIGHT:
            kinds.append("to_mesh8")
    if _is_key(h.arr):
        kinds.append("key_data")
    elif DLPACK and len(h.keys) == 1:
        kinds.append("dlpack")
    return kinds


def _components(holders: Iterable[Holder]) -> list[list[Holder]]:
    """The holders grouped by shared allocations (transitively): tidyjax's alias groups."""
    groups: list[tuple[set[Key], list[Holder]]] = []
    for h in holders:
        keys, members = set(h.keys), [h]
        rest = []
        for g_keys, g_members in groups:
            if g_keys & keys:
                keys |= g_keys
                members += g_members
            else:
                rest.append((g_keys, g_members))
        groups = [*rest, (keys, members)]
    return [members for _, members in groups]


class RuleViolationError(AssertionError):
    """A rule of docs/semantics.md broken by the program in the notes."""


class Program:
    """Runs one program, checking the model after every step."""

    def __init__(self, eager: bool) -> None:
        self.eager = eager  # read the reports after every step, or only at the end
        self.holders: dict[int, Holder] = {}
        self.cached_kept: list[tuple[weakref.ref[Any], frozenset[Key]]] = []
        self.ids = 0
        self.serials = 0
        self.classes = 0  # runtime buffer objects, numbered
        self.stack: list[tuple[int, tj.Scope | None]] = []  # open scopes, innermost last
        self.parent: dict[int, int] = {}
        self.made: dict[Key, int | None] = {}  # the scope a buffer belongs to (None: no rule)
        self.origin: dict[Key, str] = {}  # "tj" (tidyjax made it), "user" or "orphan"
        self.depth = 0
        self.lines: list[str] = []

    # -- notes -------------------------------------------------------------------------------

    def emit(self, line: str) -> None:
        note("    " * self.depth + line)
        self.lines.append("    " * self.depth + line)

    def fail(self, rule: str, h: Holder) -> None:
        raise RuleViolationError(
            f"{rule}: {h.name} = {h.how} (owner {h.owner!r}, made in {h.made_in})"
        )

    # -- the model's views ---------------------------------------------------------------------

    def current(self) -> int:
        return self.stack[-1][0] if self.stack else TOP

    def open_serials(self) -> set[int]:
        return {serial for serial, _ in self.stack} | {TOP}

    def nearest_open(self, serial: int) -> int:
        opened = self.open_serials()
        while serial not in opened:
            serial = self.parent[serial]
        return serial

    def user_only(self, h: Holder) -> bool:
        return all(self.origin.get(k) == "user" for k in h.keys)

    def protected(self, h: Holder, opened: set[int]) -> bool:
        if h.dead or (h.tensor and h.disposed):  # a disposed Tensor holds nothing (TF.js)
            return False
        if h.owner in opened or h.owner in (KEPT, USER):
            return True
        if h.owner == VAR:
            return not h.disposed
        return self.user_only(h)

    def usable(self) -> list[Holder]:
        return [
            h
            for h in self.holders.values()
            if not h.dead and not h.released and not (h.tensor and h.disposed)
        ]

    def live(self) -> list[Holder]:
        return [h for h in self.holders.values() if not h.dead]

    def kept_in_cache(self) -> set[Key]:
        """The allocations of kept shard views only JAX's cache still holds (see `drop`)."""
        self.cached_kept = [(r, k) for r, k in self.cached_kept if _undeleted(r)]
        return {k for _, keys in self.cached_kept for k in keys}

    def tracked(self) -> set[Key]:
        """The allocations an array object tidyjax records is over."""
        return {k for h in self.live() if h.seen for k in h.keys}

    # -- running -------------------------------------------------------------------------------

    def run(self, steps: list[Step]) -> None:
        self.emit(PREAMBLE.format(devices=len(DEVS), eager=self.eager))
        self.block(steps)
        self.check_reports()

    def block(self, steps: list[Step]) -> None:
        for step in steps:
            if step[0] == "scope":
                self.scope(step)
            else:
                self.step(step)

    def step(self, step: Step) -> None:
        kind, i, j, k = step
        if kind == "drop" and self.holders:
            self.drop(list(self.holders)[i % len(self.holders)])
            self.check()
            return
        usable = self.usable()
        if kind == "key":
            self.key(i)
        elif kind == "user" and not self.stack:
            self.user(i, j)
        elif kind == "alias" and usable:
            self.alias(usable[i % len(usable)], j)
        elif kind == "keep" and usable:
            self.keep(usable[i % len(usable)], j, k)
        elif kind == "variable" and usable:
            src = usable[i % len(usable)]
            self.add(tj.Variable(src.obj), f"tj.Variable({src.name})", "tj", VAR, src=src)
        elif kind == "dispose" and [h for h in usable if h.tensor]:
            tensors = [h for h in usable if h.tensor]
            self.dispose(tensors[i % len(tensors)])
        else:
            self.fresh(i, j)
        del usable  # no reference of the step's outlives it (a later drop must free it)
        self.check()

    def add(
        self,
        obj: Any,
        how: str,
        origin: str,
        owner: Owner | None = None,
        src: Holder | None = None,
        dlpack: bool = False,
    ) -> Holder:
        tensor = isinstance(obj, tj.Tensor)
        arr = obj.array if tensor else obj
        keys = _keys(arr)
        live = self.live()
        alive = {k for h in live for k in h.keys}
        own = {u[0]: u[1] for u in src.units} if src is not None and not dlpack else {}
        units = []
        for k in sorted(keys):
            if k not in alive:  # a new allocation
                self.made[k] = None if origin == "user" else self.current()
                self.origin[k] = origin
            if k not in own:
                self.classes += 1
                own[k] = self.classes
            units.append((k, own[k]))
        is_var = tensor and isinstance(obj, tj.Variable)
        h = Holder(
            hid=self.ids,
            obj=obj,
            arr=arr,
            keys=keys,
            units=frozenset(units),
            tensor=tensor,
            owner=owner if owner is not None else VAR if is_var else self.current(),
            made_in=self.current(),
            how=how,
            shards=tuple(s.data for s in arr.addressable_shards) if len(keys) > 1 else (),
            dlpack=dlpack or (src is not None and src.dlpack),
            seen=tensor or any(g.seen and g.arr is arr for g in live),
        )
        self.ids += 1
        self.holders[h.hid] = h
        self.emit(f"{h.name} = K({how})")
        return h

    # -- steps ---------------------------------------------------------------------------------

    def fresh(self, i: int, j: int) -> None:
        n = 1 + i % 4
        if EIGHT and j % 2:
            t = tj.tensor(np.arange(n, dtype=np.float32), device=MESH8) * 1
            how = f"tj.tensor(np.arange({n}, dtype=np.float32), device=mesh8) * 1"
        else:
            t = tj.tensor(np.arange(n, dtype=np.float32)) * 1
            how = f"tj.tensor(np.arange({n}, dtype=np.float32)) * 1"
        self.add(t, how, "tj")

    def key(self, i: int) -> None:
        i %= 4
        self.add(tj.tensor(jax.random.key(i)), f"tj.tensor(jax.random.key({i}))", "tj")

    def user(self, i: int, j: int) -> None:
        n = 1 + i % 4
        where = MESH8 if EIGHT and j % 2 else DEV0
        raw = jax.device_put(np.arange(n, dtype=np.float32), where)
        label = "mesh8" if where is MESH8 else "dev0"
        self.add(raw, f"jax.device_put(np.arange({n}, dtype=np.float32), {label})", "user", USER)

    def alias(self, src: Holder, j: int) -> None:
        kinds = _alias_kinds(src)
        kind = kinds[j % len(kinds)]
        template, op = ALIASES[kind]
        out = op(src)
        how = template.format(t=src.name, a=src.array_expr)
        if kind == "tensors" and not src.tensor:
            how = f"tj.tensors([{src.name}])[0]"
        origin = "tj" if isinstance(out, tj.Tensor) else "user"
        self.add(out, how, origin, src=src, dlpack=kind == "dlpack")

    def keep(self, h: Holder, j: int, k: int) -> None:
        scopes = [(serial, s) for serial, s in self.stack if s is not None]
        if scopes and j % 2:
            serial, s = scopes[k % len(scopes)]
            s.keep(h.obj)
            self.emit(f"s{serial}.keep({h.name})")
            self.hand_out(h, serial)
        else:
            tj.keep(h.obj)
            self.emit(f"tj.keep({h.name})")
            h.kept = True
            if h.owner != VAR:
                h.owner = KEPT
            for key in h.keys:
                self.made[key] = None  # kept: no scope frees it (until a dispose)
            self.recognised(h)

    def dispose(self, x: Holder) -> None:
        live = self.live()
        # what keeps the buffer: another live Tensor (a Variable too) or a kept raw array over
        # any of its allocations
        others = [
            h
            for h in live
            if h is not x
            and h.keys & x.keys
            and ((h.tensor and not h.disposed) or (not h.tensor and h.kept))
        ]
        ours = all(self.origin.get(k) == "tj" for k in x.keys)  # a buffer tidyjax made
        cached = x.keys & self.kept_in_cache()
        tj.dispose(x.obj)
        self.emit(f"tj.dispose({x.name})")
        x.disposed = True
        if x.owner == VAR:  # the buffer it lets go is its scope's again (kept: stays kept)
            x.owner = AMBIGUOUS if x.kept else self.nearest_open(x.made_in)
        elif x.owner == KEPT:
            x.owner = AMBIGUOUS
        if others or cached:  # what only ``x`` held of its buffer is released (allowed)
            for k in x.keys - {k for h in others for k in h.keys} - cached:
                self.made[k] = None
        else:
            for h in live:
                if h.arr.is_deleted() and h.keys & x.keys and not self.user_only(h):
                    h.dead = True  # the buffer went with its last Tensor, every alias too
            if ours and not x.arr.is_deleted():
                self.fail("dispose: the last live Tensor's buffer was not deleted", x)
        self.orphans()

    def drop(self, hid: int) -> None:
        self.emit(f"del h[{hid}]; gc.collect()")
        h = self.holders.pop(hid)
        ref = weakref.ref(h.arr) if h.kept and not h.tensor else None
        keys = h.keys
        del h
        gc.collect()
        if ref is not None and (arr := ref()) is not None and not arr.is_deleted():
            # A kept shard view outlives the caller's reference: JAX caches it on its parent
            # (``x.addressable_data(0)`` gives the same object again), so it is still kept.
            self.cached_kept.append((ref, keys))
        del ref
        self.orphans()

    def orphans(self) -> None:
        """A buffer tidyjax made whose recorded array objects are all gone (collected, or
        Tensors disposed while it lived on), only raw aliases it never met holding it, is no
        scope's any more: the caller's plain array (or tidyjax's again when an alias check ran
        first; no rule says which). After a drop, a scope's exit and a ``dispose``."""
        recorded = {
            k for h in self.live() if h.seen and not (h.tensor and h.disposed) for k in h.keys
        }
        for h in self.live():
            for k in h.keys - recorded:
                if self.origin.get(k) == "tj":
                    self.origin[k] = "orphan"
                    self.made[k] = None

    def recognised(self, h: Holder) -> None:
        """A raw array handed to tidyjax (``keep``, a result) is recognised by address while
        tidyjax records an array over its buffer; else it is a plain array, the caller's."""
        if not h.seen and h.keys & self.tracked():
            h.seen = True

    def hand_out(self, h: Holder, serial: int) -> None:
        """``h`` leaves scope ``serial`` (returned, or its ``keep``): it and the buffers it
        reaches that belong to that scope or one inside it belong to the scope around it."""
        inside = {s for s, _ in self.stack[[s for s, _ in self.stack].index(serial) :]}
        to = self.parent[serial]
        if h.owner in inside or h.owner == CLOSED:
            h.owner = to
        for k in h.keys:
            if self.made.get(k) in inside:
                self.made[k] = to
        self.recognised(h)

    def scope(self, step: Step) -> None:
        _, style, steps, handout = step
        serial = self.serials
        self.serials += 1
        self.parent[serial] = self.current()
        name = f"s{serial}"

        def inside(scope: tj.Scope | None) -> list[Holder]:
            self.stack.append((serial, scope))
            self.depth += 1
            try:
                self.block(steps)
                usable = self.usable()
                picked = [usable[i % len(usable)] for i in handout] if usable else []
                handed = list({id(h): h for h in picked}.values())
                names = ", ".join(h.name for h in handed)
                if handed and scope is not None:
                    scope.keep([h.obj for h in handed])
                    self.emit(f"{name}.keep([{names}])")
                elif scope is None:
                    self.emit(f"return [{names}]")
                for h in handed:
                    self.hand_out(h, serial)
                return handed
            finally:
                self.depth -= 1
                self.stack.pop()

        if style == "with":
            self.emit(f"with tj.tidy() as {name}:")
            with tj.tidy() as s:
                inside(s)
                self.emit(f"    pass  # {name} exits")
        elif style == "enter":
            self.emit(f"{name} = tj.tidy(); {name}.__enter__()")
            self.emit(f"if True:  # in {name}")
            self.emit("    pass")
            s = tj.tidy()
            s.__enter__()
            try:
                inside(s)
            except BaseException:
                s.__exit__(*sys.exc_info())
                raise
            s.__exit__(None, None, None)
            self.emit(f"{name}.__exit__(None, None, None)")
        else:
            self.emit(f"def body{serial}():")
            got: list[list[Holder]] = []

            def body() -> list[Any]:
                got.append(inside(None))
                return [h.obj for h in got[0]]

            out = tj.tidy.run(body)
            self.emit(f"out = tj.tidy.run(body{serial}); del out")
            assert all(a is h.obj for a, h in zip(out, got[0], strict=True))
            del out, got
        for h in self.holders.values():
            if h.owner == serial:
                h.owner = CLOSED
                if h.tensor:
                    h.disposed = True  # TensorFlow.js: not handed out, so disposed (object)
        self.check(exiting=serial)
        self.orphans()

    # -- the checks ----------------------------------------------------------------------------

    def check(self, exiting: int | None = None) -> None:
        live = self.live()
        opened = self.open_serials()
        protected = [h for h in live if self.protected(h, opened)]
        reached = {k for h in protected for k in h.keys} | self.kept_in_cache()
        for h in live:
            if h.arr.is_deleted():
                if any(h is p for p in protected):
                    self.fail("rule 1: a protected holder's array was deleted", h)
                if h.keys <= reached:
                    self.fail("rule 1: an array over buffers protected holders hold was deleted", h)
        if exiting is not None:
            self.rule_2(exiting, live, reached, opened)
        for h in self.holders.values():
            if h.tensor and h.obj.is_disposed != h.disposed:
                state = "disposed" if h.obj.is_disposed else "not disposed"
                self.fail(f"Tensor objects (TF.js): the Tensor is {state}", h)
        for h in live:
            if h.arr.is_deleted():
                h.dead = True
        if self.eager:
            self.emit("R()")
            self.check_reports()

    def rule_2(self, closing: int, live: list[Holder], reached: set[Key], opened: set[int]) -> None:
        for members in _components(live):
            allocs = {k for h in members for k in h.keys}
            made = {self.made.get(k) for k in allocs}
            if closing not in made or allocs <= reached:
                continue
            if allocs.isdisjoint(reached) and made == {closing}:
                seen = {u for h in members if h.seen for u in h.units}
                for h in members:
                    if h.seen or h.units & seen:  # an array object tidyjax records
                        if not h.fully_deleted():
                            self.fail(
                                "rule 2: a buffer the closing scope made that nothing "
                                "protected reaches was not deleted",
                                h,
                            )
                    elif not h.fully_deleted():
                        h.released = True  # exempt: a DLPack view tidyjax never met
            else:  # partly shared with a protected holder: releasing is allowed
                for h in members:
                    if not self.protected(h, opened):
                        h.released = True
        for k, m in list(self.made.items()):
            if m == closing:
                self.made[k] = None  # what survived is protected elsewhere (or exempt)

    def check_reports(self) -> None:
        m = tj.memory(scan_untracked=False)
        records = tj.live_tensors()
        snap = tj.snapshot(untracked=False)
        ids = sorted(h.obj.id for h in self.holders.values() if h.tensor and not h.disposed)
        assert m.num_tensors == len(ids), ("memory() counts other Tensors", m, ids)
        assert sorted(r.id for r in records if r.id) == ids, (records, ids)
        assert sorted(r.id for r in snap.records if r.id) == ids, (snap.records, ids)
        listed = {r._buffer: r.bytes for r in records}
        snapped = {r._buffer: r.bytes for r in snap.records}
        assert m.num_bytes == sum(listed.values()) == sum(snapped.values()), (m, records)
        assert m.num_data_buffers == len(listed) == len(snapped), (m, records)
        groups = _components(self.live())
        held = [g for g in groups if any(h.tensor and not h.disposed for h in g)]
        assert len(held) <= m.num_data_buffers <= len(groups), (m, records)

    def finish(self) -> None:
        last = [h for h in self.holders.values() if not (h.disposed if h.tensor else h.dead)]
        self.emit(f"tj.dispose([{', '.join(h.name for h in last)}])")
        # (not a walrus in a comprehension: its name outlives it in this frame, holding the
        # last array: one buffer left in the books, counted as escaped)
        cached = [r() for r, _ in self.cached_kept if _undeleted(r)]
        tj.dispose([*(h.obj for h in last), *cached])
        del last, cached
        self.cached_kept.clear()
        assert all(h.obj.is_disposed for h in self.holders.values() if h.tensor)
        self.holders.clear()
        gc.collect()
        m = tj.memory(scan_untracked=False)
        assert (m.num_tensors, m.num_data_buffers, m.num_bytes) == (0, 0, 0), m

    def cleanup(self) -> None:
        from tidyjax._context import CURRENT

        while isinstance(scope := CURRENT.get(), tj.Scope):  # after a failed step
            scope.__exit__(None, None, None)
        # A failed example's traceback (which Hypothesis keeps while it shrinks) holds its
        # holders: delete every array of theirs, so that nothing of it lives on into the next
        # example (and never hide the failure behind another error).
        with contextlib.suppress(tj.TidyjaxError):
            tj.dispose([h.obj for h in self.holders.values() if h.tensor])
        for h in self.holders.values():
            if not DLPACK:  # deleting arrays beside a DLPack view may abort the process (above)
                for a in (h.arr, *h.shards):
                    a.delete()
            h.obj = h.arr = None  # and let them go: a report walks every array still alive
            h.shards = ()
        self.holders.clear()
        self.cached_kept.clear()
        gc.collect()


# No explain phase: it traces every line JAX and tidyjax run, and made each shrink step seconds.
@settings(
    max_examples=120,
    phases=[p for p in Phase if p is not Phase.explain],
    derandomize=not RANDOM,
    database=None if not RANDOM else settings.default.database,
)
@given(eager=st.booleans(), steps=_steps(0))
def test_random_alias_programs_keep_the_rules(eager: bool, steps: list[Step]) -> None:
    gc.collect()
    m = tj.memory(scan_untracked=False)
    assert (m.num_tensors, m.num_data_buffers) == (0, 0), f"an earlier program left {m!r}"
    program = Program(eager)
    try:
        program.run(steps)
        program.finish()
    except BaseException:
        if SCRIPT:  # each failing program as a script (a flaky replay prints no notes)
            with open(SCRIPT, "a") as f:
                f.write("\n".join(["# ---- a failing program", *program.lines, ""]))
        raise
    finally:
        program.cleanup()


# -- the same under eight devices ---------------------------------------------------------------


@pytest.mark.skipif(len(DEVS) >= 8 or UNDER_EIGHT, reason="runs itself")
def test_under_eight_devices(request: pytest.FixtureRequest) -> None:
    # the same seed (--hypothesis-seed) there: without it, every run there drew other programs
    seed = request.config.getoption("hypothesis_seed", None)
    out = run_under_eight_devices(__file__, "-x", *([f"--hypothesis-seed={seed}"] if seed else []))
    assert "failed" not in out and ", 1 skipped" in out  # only this test
