"""Issue 40's cross-report test: over random programs, every report agrees after every step.

A program draws its steps from a seeded generator: fresh Tensors (on one device; under eight
host devices also sharded over them and replicated), ops, ``jax.device_put`` aliases to where
a Tensor already is, ``t.to(place)``, ``tidyjax.tensors`` of the caller's own arrays, Variables
and ``assign``, ``tidyjax.keep``, nested ``tidy`` scopes handing values out (``scope.keep`` in a
with-block, or returned by ``tidy.run``), ``dispose``, dropping a Tensor and collecting garbage,
a donation through ``tidyjax.jit(f, donate_argnums=0)``, and plain arrays of the caller's own.

After every step (inside open scopes too) the truth is read from JAX and Python alone: the live
Tensors are the undisposed ``Tensor`` objects the garbage collector finds, their allocations
the ``(device id, unsafe_buffer_pointer)`` of each shard of their arrays (one buffer: arrays
sharing an allocation), and every allocation alive is that of an array in
``jax.live_arrays()``. Then each report must give the same Tensors, buffers (each once) and
bytes per device:

- ``memory()`` (its untracked bytes per device too: each live array no view of a Tensor's
  allocations, whole);
- ``live_tensors(untracked=True)`` and ``snapshot()``: one record per live Tensor, the same ids,
  bytes and devices, one ``_buffer`` per buffer;
- an open ``profile()``'s running count: a profile opened and closed inside it starts from its
  running bytes (``bytes_before``) and finds no Tensor the books lack (``new_tensors == 0``);
- an open ``timeline()``'s replay now (``live_at``): one allocation per buffer, the same bytes
  per device (each allocation's ``per_device``), and the plain arrays made since it opened;
- a ``check_leaks()`` opened before the program: every live Tensor, and the caller's plain
  arrays no Tensor holds, each buffer once;
- ``jax.live_arrays()``: every Tensor's allocation is among its arrays'.

(The timeline records buffers, not Tensors: it is held to the buffers and bytes. The truth is
read after a report's look, which first has the registry group any new object over a recorded
buffer: till then it holds the arrays of Tensors collected meanwhile, `_registry.orphans`, which
JAX lists and no report counts.) At the end the replay at each earlier step equals ``memory()``
then, the outer profile's net change is the program's, and once everything is released the
leak check finds nothing. A failure's message holds the program as a script that runs it again.

Below it, one test for each disagreement the programs found under eight devices (those found
on one device are in ``test_timeline.py`` and ``test_timeline_sampler.py``). The last test runs
this file again under eight host devices.
"""

from __future__ import annotations

import gc
import os
import random
import re
import threading
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import tidyjax as tj
import tidyjax.numpy as tnp
from tidyjax import _timeline as tlm
from tidyjax._timeline_format import ALLOC

from .conftest import UNDER_EIGHT, run_under_eight_devices

DEVS = jax.devices()
EIGHT = len(DEVS) >= 8
DEV0 = DEVS[0]
if EIGHT:
    _MESH = Mesh(np.array(DEVS[:8]), ("x",))
    #: Where a Tensor is made or moved: one device, another one, sharded over eight, replicated,
    PLACES: list[Any] = [DEV0, DEVS[3], NamedSharding(_MESH, P("x")), NamedSharding(_MESH, P())]
    #: and replicated over four of them: moved there from eight, it is four of their shards
    PLACES.append(NamedSharding(Mesh(np.array(DEVS[:4]), ("x",)), P()))
else:
    PLACES = [DEV0, NamedSharding(Mesh(np.array(DEVS[:1]), ("x",)), P())]
SIZES = (64, 256, 1024)  # float32 elements, each a multiple of 8 (sharded over eight)
MAX_DEPTH = 2
STEPS = 30  # a program's steps at the top level (a scope's inside it come on top)
SEEDS = 16
# TIDYJAX_REPORT_SEEDS=FIRST draws seeds FIRST..FIRST+15 instead (new programs, as the alias
# model's TIDYJAX_ALIAS_MODEL=1): 0-15 run in every test run.
FIRST_SEED = int(os.environ.get("TIDYJAX_REPORT_SEEDS", "0"))

DOUBLE = tj.jit(lambda x: x * 2, donate_argnums=0)

Key = tuple[int, int]  # one allocation: (device id, address)


# -- the truth, from JAX and Python alone ---------------------------------------------------------


def _shards(arr: jax.Array) -> dict[Key, tuple[str, int]]:
    """Each allocation of ``arr``: its device's name and bytes (read from JAX's shards)."""
    if len(arr.sharding.device_set) == 1:
        (dev,) = arr.sharding.device_set
        return {(dev.id, arr.unsafe_buffer_pointer()): (str(dev), int(arr.nbytes))}
    return {
        (s.device.id, s.data.unsafe_buffer_pointer()): (str(s.device), int(s.data.nbytes))
        for s in arr.addressable_shards
    }


def _merge(into: dict[Key, tuple[str, int]], allocs: dict[Key, tuple[str, int]]) -> None:
    """``allocs`` added to ``into``: an allocation two arrays hold parts of (a sharded array
    sliced from a replicated one on CPU starts where it does) counts the most either holds."""
    for key, (dev, nbytes) in allocs.items():
        if key not in into or into[key][1] < nbytes:
            into[key] = (dev, nbytes)


def _splits(place: Any) -> bool:
    """Whether ``place`` splits an array along an axis."""
    return isinstance(place, NamedSharding) and any(p is not None for p in place.spec)


def _per_device(allocs: dict[Key, tuple[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for dev, nbytes in allocs.values():
        out[dev] = out.get(dev, 0) + nbytes
    return out


class _Truth:
    """What is alive now, read from JAX and Python: the live Tensors, their buffers (arrays
    sharing an allocation are one), the allocations of every live array."""

    def __init__(self) -> None:
        gc.collect()
        self.tensors = {
            o.id: o for o in gc.get_objects() if isinstance(o, tj.Tensor) and not o.is_disposed
        }
        # Union-find over the Tensors' arrays: one buffer per set of arrays sharing allocations.
        self.allocs: dict[Key, tuple[str, int]] = {}
        owner: dict[Key, int] = {}  # allocation -> a Tensor id over it
        parent: dict[int, int] = {i: i for i in self.tensors}

        def find(i: int) -> int:
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        self.deleted: set[int] = set()
        for i, t in self.tensors.items():
            arr = t.array
            if arr.is_deleted():  # deleted behind tidyjax's back: a Tensor of no bytes
                self.deleted.add(i)
                continue
            mine = _shards(arr)
            _merge(self.allocs, mine)
            for key in mine:
                if key in owner:
                    parent[find(i)] = find(owner[key])
                else:
                    owner[key] = i
        self.buffer_of = {i: find(i) for i in self.tensors}  # Tensor id -> its buffer's root
        roots = {r for i, r in self.buffer_of.items() if i not in self.deleted}
        self.num_buffers = len(roots)
        # A buffer's logical bytes: its largest array's (a replicated array counts once).
        self.num_bytes = sum(
            max(int(self.tensors[i].array.nbytes) for i, r in self.buffer_of.items() if r == root)
            for root in roots
        )
        self.per_device = _per_device(self.allocs)
        self.live: dict[Key, tuple[str, int]] = {}  # every live array's allocations
        arrays = [a for a in jax.live_arrays() if not a.is_deleted()]
        for a in arrays:
            _merge(self.live, _shards(a))
        # the plain arrays: each live array no view of a Tensor's allocations, one per buffer
        self.plain = _one_per_buffer(arrays, self.allocs.keys())

    def partition(self, of: dict[int, Any]) -> set[frozenset[int]]:
        """The Tensor ids grouped by a report's buffer (``of``: id -> its buffer there)."""
        groups: dict[Any, set[int]] = {}
        for i, b in of.items():
            groups.setdefault(b, set()).add(i)
        return {frozenset(g) for g in groups.values()}

    def buffers(self) -> set[frozenset[int]]:
        return self.partition({i: r for i, r in self.buffer_of.items() if i not in self.deleted})


# -- the program ----------------------------------------------------------------------------------


class _Program:
    """A random program; what it holds stays alive until `release`.

    Each step is a line of code run over the program's lists (``F``: the Tensors held in each
    open scope, outermost first, ``F[-1]`` the current one; ``V`` the Variables; ``K`` the kept
    Tensors; ``R`` the caller's own plain arrays, some with Tensors on them), and ``log`` is the
    program as a script (`script`): each step, ``P()`` where the disposed Tensors leave the lists
    (a scope's exit, a dispose of an alias, a donation dispose some), ``C(...)`` where the
    reports are compared.
    """

    KINDS = (
        *["fresh"] * 3, *["op"] * 2, *["alias"] * 2, "to", "tensors", "plain", "drop_plain",
        "variable", "assign", "keep", *["scope"] * 2, *["dispose"] * 2, "drop", "donate",
    )  # fmt: skip

    def __init__(self, seed: int, check: Callable[[str], None] | None = None) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.F: list[list[tj.Tensor]] = [[]]
        self.V: list[tj.Tensor] = []
        self.K: list[tj.Tensor] = []
        self.R: list[jax.Array] = []
        self.ns: dict[str, Any] = {
            "tj": tj, "tnp": tnp, "jax": jax, "np": np, "gc": gc, "PLACES": PLACES,
            "double": DOUBLE, "F": self.F, "V": self.V, "K": self.K, "R": self.R,
            "P": self.prune, "C": check or (lambda step: None),
        }  # fmt: skip
        self.check = check
        self.log: list[str] = []
        self.steps = 0
        self.depth = 0  # the scopes open

    def _lists(self) -> list[list[tj.Tensor]]:
        return [*self.F, self.V, self.K]

    def prune(self) -> None:
        for held in self._lists():
            held[:] = [t for t in held if not t.is_disposed]

    def _pick(self, unless: Callable[[tj.Tensor], bool] | None = None) -> tuple[str, int] | None:
        """A held Tensor (not one ``unless`` is true of), as code: its list (``F[0]``, ``V``,
        ``K``) and index."""
        options = [(held, j) for held in self._lists() for j in range(len(held))]
        if unless is not None:
            options = [(held, j) for held, j in options if not unless(held[j])]
        if not options:
            return None
        held, j = self.rng.choice(options)
        if held is self.V:
            return "V", j
        if held is self.K:
            return "K", j
        return f"F[{[id(f) for f in self.F].index(id(held))}]", j

    def _data(self) -> str:
        return f"np.full({self.rng.choice(SIZES)}, {self.rng.random():.3f}, np.float32)"

    def _place(self) -> str:
        return f"PLACES[{self.rng.randrange(len(PLACES))}]"

    def _run(self, code: str) -> None:
        self.log.append("    " * self.depth + code)
        exec(code, self.ns)

    def _line(self, code: str) -> None:
        self.log.append("    " * self.depth + code)

    # the steps

    def run(self, n: int) -> None:
        for _ in range(n):
            self.step()

    def step(self) -> None:
        kind = self.rng.choice(self.KINDS)
        if kind == "scope" and self.depth >= MAX_DEPTH:
            kind = "fresh"
        self.steps += 1
        number = self.steps  # a scope's steps are numbered after it
        getattr(self, f"_{kind}")()
        self._run("P()")
        if self.check is not None:
            self._run(f"C({f'step {number} ({kind})'!r})")

    def _fresh(self) -> None:
        self._run(f"F[-1].append(tj.tensor({self._data()}, device={self._place()}))")

    def _op(self) -> None:
        if (got := self._pick()) is None:
            return self._fresh()
        x = f"{got[0]}[{got[1]}]"
        op = self.rng.choice([f"{x} * 2", f"tnp.sin({x}) + {x}", f"tnp.sum({x})"])
        self._run(f"F[-1].append({op})")

    def _alias(self) -> None:  # a Tensor over the same buffer
        if (got := self._pick()) is None:
            return self._fresh()
        x = f"{got[0]}[{got[1]}]"
        self._run(f"F[-1].append(jax.device_put({x}, {x}.array.sharding))")

    def _to(self) -> None:
        if (got := self._pick()) is None:
            return self._fresh()
        x = f"{got[0]}[{got[1]}]"
        scalar = eval(x, self.ns).ndim == 0  # not sharded: a scalar has no axis to split
        places = [i for i, p in enumerate(PLACES) if not (scalar and _splits(p))]
        self._run(f"F[-1].append({x}.to(PLACES[{self.rng.choice(places)}]))")

    def _tensors(self) -> None:  # Tensors on the caller's own arrays
        place = self._place()
        n = self.rng.randint(1, 2)
        raws = ", ".join(f"jax.device_put({self._data()}, {place})" for _ in range(n))
        self._run(f"R.extend(raws := [{raws}]); F[-1].extend(tj.tensors(raws)); del raws")

    def _plain(self) -> None:
        self._run(f"R.append(jax.device_put({self._data()}, {self._place()}) + 1)")

    def _drop_plain(self) -> None:
        if self.R:
            self._run(f"del R[{self.rng.randrange(len(self.R))}]")

    def _variable(self) -> None:
        got = self._pick() if self.rng.random() < 0.5 else None
        of = f"{got[0]}[{got[1]}]" if got else f"tj.tensor({self._data()})"
        self._run(f"V.append(tj.Variable({of}))")

    def _assign(self) -> None:
        if not self.V:
            return self._variable()
        v = f"V[{self.rng.randrange(len(self.V))}]"
        if self.rng.random() < 0.5:
            self._run(f"with tj.tidy(): {v}.assign({v} * 2)")
        else:
            self._run(f"{v}.assign({v} + 1)")

    def _keep(self) -> None:
        got = self._pick()
        if got is not None and self.rng.random() < 0.5:
            self._run(f"K.append(tj.keep({got[0]}.pop({got[1]})))")
        else:
            self._run(f"with tj.tidy(): K.append(tj.keep(tj.tensor({self._data()}) + 1))")

    def _scope(self) -> None:
        """A nested scope of 1 to 4 steps handing some of its values out: a with-block with
        ``scope.keep``, or a function ``tidy.run`` runs, returning them."""
        n, d = self.rng.randint(1, 4), self.depth
        if self.rng.random() < 0.5:
            self._line(f"with tj.tidy() as s{d}:")
            with tj.tidy() as scope:
                self.ns[f"s{d}"] = scope
                self.depth += 1
                self._run("F.append([])")
                for _ in range(n):
                    self.step()
                self._run(f"s{d}.keep(out := {self._handed()})")
                self.depth -= 1
        else:
            self._line(f"def body{d}():")

            def body() -> Any:
                self.depth += 1
                self._run("F.append([])")
                for _ in range(n):
                    self.step()
                handed = self._handed()
                self._line(f"return {handed}")
                self.depth -= 1
                return eval(handed, self.ns)

            self.ns["out"] = tj.tidy.run(body)
            self._line(f"out = tj.tidy.run(body{d})")
        self._run("F.pop(); F[-1].extend(out); del out")

    def _handed(self) -> str:
        """Some of the current scope's Tensors, as code."""
        made = range(len(self.F[-1]))
        return "[" + ", ".join(f"F[-1][{j}]" for j in made if self.rng.random() < 0.5) + "]"

    def _dispose(self) -> None:
        if (got := self._pick()) is not None:
            self._run(f"tj.dispose({got[0]}.pop({got[1]}))")

    def _drop(self) -> None:
        if (got := self._pick()) is not None:
            self._run(f"del {got[0]}[{got[1]}]; gc.collect()")

    def _donate(self) -> None:
        """Not of a buffer another Tensor holds as one of its shards: see
        `test_donating_a_buffer_a_replicated_tensor_holds_as_a_shard_disposes_that_tensor`."""
        if (got := self._pick(unless=self._shared_in_part)) is None:
            return self._fresh()
        self._run(f"F[-1].append(double({got[0]}.pop({got[1]})))")

    def _shared_in_part(self, t: tj.Tensor) -> bool:
        """Whether another held Tensor shares some of ``t``'s allocations, not all."""
        mine = set(_shards(t.array))
        for held in self._lists():
            for u in held:
                if u is not t and not u.is_disposed and not u.array.is_deleted():
                    theirs = set(_shards(u.array))
                    if mine & theirs and mine != theirs:
                        return True
        return False

    def script(self) -> str:
        """The program as a script that runs it again, the checks with it (run it from the
        repository's root)."""
        return SCRIPT.format(seed=self.seed) + "\n".join(self.log) + "\n"

    def release(self) -> None:
        tj.dispose(self._lists())
        for held in (*self._lists(), self.R):
            held.clear()
        del self.F[1:]
        self.ns.pop("out", None)


#: The head of a program's script: the reports compared after each step as the test does.
SCRIPT = """import gc, sys
sys.path.insert(0, ".")
import jax, numpy as np
import tidyjax as tj, tidyjax.numpy as tnp
from tests.test_reports_agree_random import DOUBLE as double, PLACES, _Program, _Reports, _warm

_warm({seed})
reports = _Reports()
program = _Program({seed}, lambda step: reports.check(program, step))
F, V, K, R, P, C = program.F, program.V, program.K, program.R, program.prune, program.check
"""


# -- the reports, compared with the truth ---------------------------------------------------------


def _names(per_device: Any) -> dict[str, int]:
    """Bytes per device keyed by the device's name, devices with none left out."""
    return {str(d): int(b) for d, b in per_device.items() if b}


class _Reports:
    """The observers opened before the program, and the comparisons after each step."""

    def __init__(self) -> None:
        # The timeline's sampler thread holds the arrays it looks at while it looks: the checks
        # read what is alive while it does not look (it looks between them, as the steps run).
        self.quiet = threading.Lock()
        real = self.look = tlm._Sampler._look

        def look(sampler: Any) -> bool:
            with self.quiet:
                return real(sampler)

        tlm._Sampler._look = look  # type: ignore[method-assign]
        gc.collect()
        # the arrays alive before: held, so that no new array takes an address of theirs
        self.before = [a for a in jax.live_arrays() if not a.is_deleted()]
        self.before_allocs: set[Key] = set()
        for a in self.before:
            self.before_allocs.update(_shards(a))
        self.checker = tj.check_leaks(count_locals=True).__enter__()
        self.timeline = tj.timeline().__enter__()
        self.profile = tj.profile().__enter__()
        self.moments: list[tuple[float, int, str]] = []  # (time, tidyjax bytes, the step)
        self.start_bytes = tj.memory(scan_untracked=False).num_bytes
        self.start_tensors = tj.memory(scan_untracked=False).num_tensors

    def check(self, program: _Program, step: str) -> None:
        with self.quiet:
            self._check(program, step)

    def _check(self, program: _Program, step: str) -> None:
        jax.block_until_ready(jax.live_arrays())  # addresses are compared when ready
        # The registry holds the arrays of Tensors collected while it still had to tell whether
        # a new object shares their buffer, until it tells (`_registry.orphans`): each report
        # has it tell first, so the truth is read after that.
        tj.memory(scan_untracked=False)
        truth = _Truth()
        where = f"at {step} of this program:\n{program.script()}"
        plains: dict[Key, tuple[str, int]] = {}
        for a in program.R:
            if not a.is_deleted():
                _merge(plains, _shards(a))
        # each plain array whole, as the census counts it, less the allocations a Tensor holds
        # whole (counted once, as the Tensor's: docs/semantics.md, "Released, not deleted")
        untracked = _spread(truth.plain, less=truth.allocs)
        made_since = [a for a in truth.plain if not _shards(a).keys() <= self.before_allocs]
        # the caller's arrays a leak check counts: those no view of a Tensor's allocations
        own = _one_per_buffer([a for a in program.R if not a.is_deleted()], truth.allocs.keys())

        # jax.live_arrays(): every Tensor's allocation is a live array's; the caller's plain
        # arrays too
        assert truth.allocs.keys() <= truth.live.keys(), where
        assert plains.keys() <= truth.live.keys(), where

        # memory()
        info = tj.memory()
        assert info.num_tensors == len(truth.tensors), where
        assert info.num_data_buffers == truth.num_buffers, where
        assert info.num_bytes == truth.num_bytes, where
        assert _names(info.bytes_per_device) == truth.per_device, where
        assert _names(info.untracked_per_device) == untracked, where
        assert info.untracked_bytes is not None, where

        # live_tensors() and snapshot(): a record per live Tensor, one _buffer per buffer
        snap = tj.snapshot()
        listed = list(tj.live_tensors(untracked=True))
        for name, records in [
            ("live_tensors", listed),
            ("snapshot", [*snap.records, *snap.untracked]),
        ]:
            tensors = {r.id: r for r in records if r.id}
            assert tensors.keys() == truth.tensors.keys(), (name, where)
            assert not [r for r in records if r.scope == "<escaped>"], (name, where)
            for i, r in tensors.items():
                arr = truth.tensors[i].array
                want = 0 if i in truth.deleted else int(arr.nbytes)
                assert (r.bytes, r.shape) == (want, tuple(arr.shape)), (name, i, where)
                devices = tuple(sorted(str(d) for d in arr.sharding.device_set))
                assert r.devices == devices, (name, i, where)
            live = {i: r._buffer for i, r in tensors.items() if i not in truth.deleted}
            assert truth.partition(live) == truth.buffers(), (name, where)
            by_buffer = {r._buffer: r.bytes for r in tensors.values()}
            assert sum(by_buffer.values()) == truth.num_bytes, (name, where)
            raw = {r._buffer: r.bytes for r in records if r.scope == "<untracked>"}
            assert sum(raw.values()) == info.untracked_bytes, (name, where)

        # the open profile's running count: a profile inside it starts from it
        with tj.profile() as inner:
            pass
        assert inner.bytes_before == truth.num_bytes, where
        assert (inner.new_tensors, inner.new_bytes) == (0, 0), where
        assert self.profile.peak_bytes >= truth.num_bytes, where

        # the timeline's replay now: an allocation per buffer, the same bytes on each device
        tl = self.timeline
        tl.mark()
        now = time.perf_counter()
        replay = tl.live_at(now)
        tracked = [r for r in replay if r.scope not in ("<untracked>", "<watched>")]
        plain = [r for r in replay if r.scope == "<untracked>"]
        assert len({r._buffer for r in tracked}) == len(tracked) == truth.num_buffers, where
        assert sum(r.bytes for r in tracked) == truth.num_bytes, where
        spread = {ev.buffer: ev.per_device for ev in tl.events if ev.kind == ALLOC}
        replayed: dict[str, int] = {}
        for r in tracked:
            for dev, nbytes in spread[r._buffer]:
                replayed[dev] = replayed.get(dev, 0) + nbytes
        assert {d: b for d, b in replayed.items() if b} == truth.per_device, where
        made = {r._buffer: r.bytes for r in plain}
        assert sum(made.values()) == sum(int(a.nbytes) for a in made_since), where
        self.moments.append((now, truth.num_bytes, step))

        # check_leaks: every live Tensor (all made inside), and the caller's arrays no Tensor
        # holds, each buffer once
        report = tj.LeakReport(self.checker.leaked())
        assert {r.id for r in report.tensors} == truth.tensors.keys(), where
        assert sum(r.bytes for r in report.arrays) == sum(int(a.nbytes) for a in own), where
        assert len(report.arrays) == len(own), where

    def close(self, program: _Program) -> None:
        """The history and the net change, then everything released: nothing leaked."""
        where = f"at the end of this program:\n{program.script()}"
        end = tj.memory(scan_untracked=False)
        self.profile.__exit__(None, None, None)
        prof = self.profile
        assert prof.new_bytes == end.num_bytes - self.start_bytes, where
        assert prof.new_tensors == end.num_tensors - self.start_tensors, where
        assert prof.peak_bytes >= max((b for _, b, _ in self.moments), default=0), where
        for at, nbytes, step in self.moments:  # the replay of every step still holds
            replay = self.timeline.live_at(at)
            tracked = [r for r in replay if r.scope not in ("<untracked>", "<watched>")]
            assert sum(r.bytes for r in tracked) == nbytes, f"{step}, {where}"
        program.release()
        gc.collect()
        assert self.checker.leaked() == [], where

    def stop(self) -> None:
        """Every observer stopped (a failed check left them open), the arrays let go."""
        self.profile.__exit__(None, None, None)  # idempotent
        if self.timeline.recording:
            self.timeline.__exit__(None, None, None)
        self.checker.__exit__(AssertionError, None, None)  # no check: close() did it
        tlm._Sampler._look = self.look  # type: ignore[method-assign]
        self.before = []


def _one_per_buffer(arrays: list[jax.Array], taken: Any) -> list[jax.Array]:
    """``arrays`` less the views of the allocations ``taken`` or of another of them (all of
    its allocations among theirs), one per buffer: the arrays with the most allocations first.
    One that shares only some allocations with those counts whole, as the census counts it (on
    CPU a sharded array sliced from a replicated one starts where its first copy does)."""
    out: list[jax.Array] = []
    seen = set(taken)
    for a in sorted(arrays, key=lambda a: -len(_shards(a))):
        keys = _shards(a).keys()
        if not keys <= seen:
            out.append(a)
            seen |= keys
    return out


def _spread(
    arrays: list[jax.Array], less: dict[Key, tuple[str, int]] | None = None
) -> dict[str, int]:
    """The bytes of ``arrays`` on each device, each array whole, less its allocations that
    ``less`` holds whole (at least the array's bytes there)."""
    out: dict[str, int] = {}
    for a in arrays:
        for key, (dev, nbytes) in _shards(a).items():
            if less is None or key not in less or less[key][1] < nbytes:
                out[dev] = out.get(dev, 0) + nbytes
    return {d: b for d, b in out.items() if b}


def _warm(seed: int) -> None:
    """Run the program once unchecked: compiles what it runs, fills JAX's caches."""
    warm = _Program(seed)
    warm.run(STEPS)
    warm.release()
    del warm
    gc.collect()


@pytest.mark.parametrize("seed", range(FIRST_SEED, FIRST_SEED + SEEDS))
def test_every_report_agrees_after_every_step_of_a_random_program(seed: int) -> None:
    """On a failure, the message holds the program as a script that runs it again."""
    _warm(seed)
    reports = _Reports()
    program = _Program(seed, lambda step: reports.check(program, step))
    try:
        assert (reports.start_tensors, reports.start_bytes) == (0, 0)  # all made inside
        program.run(STEPS)
        reports.close(program)
        assert program.steps >= STEPS and len(reports.moments) == program.steps
    finally:
        program.release()
        reports.stop()


# -- what the programs found under eight devices, one case each ---------------------------------

eight = pytest.mark.skipif(not EIGHT, reason="needs 8 devices (run under eight below)")


def _replayed_per_device(tl: tj.Timeline) -> dict[str, int]:
    """The timeline's replay now: the tidyjax bytes on each device."""
    tl.mark()
    spread = {ev.buffer: ev.per_device for ev in tl.events if ev.kind == ALLOC}
    out: dict[str, int] = {}
    for r in tl.live_at(time.perf_counter()):
        if r.scope not in ("<untracked>", "<watched>"):
            for dev, nbytes in spread[r._buffer]:
                out[dev] = out.get(dev, 0) + nbytes
    return out


def _tracked(tl: tj.Timeline) -> list[tj.TensorRecord]:
    tl.mark()
    now = time.perf_counter()
    return [r for r in tl.live_at(now) if r.scope not in ("<untracked>", "<watched>")]


@eight
def test_a_replicated_tensor_made_from_a_one_device_one_is_one_buffer_on_every_device() -> None:
    """``x.to(replicated)`` keeps ``x``'s buffer as its shard on ``x``'s device and adds seven:
    one buffer (grouped), on eight devices. ``memory()`` counted the group by one record
    (``x``: one device); the timeline, looking before any report grouped them, told the
    replicated array as a second allocation (its addresses matched none whole)."""
    every = {str(d): 4096 for d in DEVS[:8]}
    with tj.timeline(sample=None) as tl:
        x = tj.tensor(np.ones(1024, np.float32), device=DEVS[3])
        r = x.to(PLACES[3])
        jax.block_until_ready(r.array)
        assert (3, x.array.unsafe_buffer_pointer()) in _shards(r.array)  # the case: shared
        assert len(_tracked(tl)) == 1 and _replayed_per_device(tl) == every  # before a report
        info = tj.memory(scan_untracked=False)
        assert (info.num_data_buffers, info.num_bytes) == (1, 4096)
        assert _names(info.bytes_per_device) == every
        tj.dispose(r)  # x alone again: one device
        alone = {str(DEVS[3]): 4096}
        assert _replayed_per_device(tl) == _names(tj.memory().bytes_per_device) == alone
        assert _tracked(tl)[0].bytes == 4096
        tj.dispose(x)
    assert tl.peak_bytes == 4096


@eight
def test_a_callers_replicated_array_whose_tensor_went_counts_apart_from_the_group() -> None:
    """Seed 80 (``TIDYJAX_REPORT_SEEDS=80``): ``t`` wraps the caller's array replicated over
    eight, ``u = t.to(four devices)`` shares four of its shards (one buffer: grouped). Once
    ``t`` is gone the array is the caller's plain array again, counted untracked on the four
    devices ``u`` does not hold; ``memory()`` counted those four shards as ``u``'s too (its
    group's spread took every record's allocations): 1024 B on each twice. A leak check
    counted the array as its four shard views there (the group's Tensor "held" it)."""
    checker = tj.check_leaks().__enter__()
    held = [jax.device_put(np.full(256, 0.5, np.float32), PLACES[3])]  # not a local name
    with tj.timeline(sample=None) as tl:
        t = tj.tensors(held)[0]
        u = t.to(PLACES[4])
        tj.memory()  # grouped
        del t
        gc.collect()
        info = tj.memory()
        four = {str(d): 1024 for d in DEVS[:4]}
        assert _names(info.bytes_per_device) == four
        assert _names(info.untracked_per_device) == {str(d): 1024 for d in DEVS[4:8]}
        assert _replayed_per_device(tl) == four
        listed = [r for r in tj.live_tensors() if r.scope != "<untracked>"]
        assert sum(r.bytes for r in listed) == 1024
        report = tj.LeakReport(checker.leaked())
        assert [(r.shape, r.bytes) for r in report.arrays] == [((256,), 1024)]
        tj.dispose(u)
    del held
    checker.__exit__(None, None, None)


@eight
def test_two_copies_of_shards_of_one_replicated_buffer_are_two_buffers_once_it_went() -> None:
    """Seed 537 (``TIDYJAX_REPORT_SEEDS=528``): ``x`` replicated over eight, ``a`` and ``b``
    its copies on two devices (each ``x``'s shard there): one group of three records. Once
    ``x`` went, ``a`` and ``b`` share nothing, yet the group held them as one buffer: every
    report counted one buffer of 256 B where two live (``memory()``, a profile's count, the
    timeline's replay), and freeing one handed the buffer on to the other."""
    with tj.timeline(sample=None) as tl, tj.profile():
        x = tj.tensor(np.ones(64, np.float32), device=PLACES[3])
        a, b = x.to(DEVS[0]), x.to(DEVS[3])
        jax.block_until_ready([a.array, b.array])
        assert _shards(a.array).keys() | _shards(b.array).keys() <= _shards(x.array).keys()
        assert tj.memory().num_data_buffers == 1  # grouped: one buffer
        tj.dispose(x)
        info = tj.memory()
        assert (info.num_data_buffers, info.num_bytes) == (2, 512)
        with tj.profile() as inner:
            pass
        assert inner.bytes_before == 512
        tl.mark()
        replay = [r for r in tl.live_at(time.perf_counter()) if r.scope != "<untracked>"]
        assert (len(replay), sum(r.bytes for r in replay)) == (2, 512)
        tj.dispose(a)
        assert a.is_disposed and not b.array.is_deleted()
        assert float(b.array.sum()) == 64.0
        info = tj.memory()
        assert (info.num_data_buffers, info.num_bytes) == (1, 256)
        tj.dispose(b)
        assert b.is_disposed
    assert tj.memory(scan_untracked=False).num_data_buffers == 0


@eight
def test_two_copies_of_one_sharding_sharing_one_allocation_hold_their_own_others() -> None:
    """Seed 159 (``TIDYJAX_REPORT_SEEDS=144``): ``x.to(four devices)`` twice keeps ``x``'s
    buffer as each copy's shard on ``x``'s device and adds three of its own each: one group of
    records. Once ``x`` went, the timeline told the group's layout from its records' one
    sharding (4096 B on each of four devices) where they hold 4096 on ``x``'s device and 8192 on
    each other (``memory()`` reads their allocations)."""
    with tj.timeline(sample=None) as tl:
        x = tj.tensor(np.ones(1024, np.float32), device=DEVS[0])
        r1, r2 = x.to(PLACES[4]), x.to(PLACES[4])
        jax.block_until_ready([r1.array, r2.array])
        assert _shards(r1.array).keys() & _shards(r2.array).keys() == _shards(x.array).keys()
        tl.mark()
        tj.dispose(x)
        want = {str(DEVS[0]): 4096, **{str(d): 8192 for d in DEVS[1:4]}}
        assert _replayed_per_device(tl) == _names(tj.memory().bytes_per_device) == want
        tj.dispose([r1, r2])


@eight
def test_a_record_that_leaves_a_shared_buffer_takes_its_allocations_with_it() -> None:
    """``r.to(device)`` of a replicated ``r`` keeps ``r``'s shard there: one buffer. Once ``r``
    goes, its seven other allocations are freed: the timeline tells the buffer on one device
    again, and no longer takes a new array at one of their addresses for the buffer's."""
    with tj.timeline(sample=None) as tl:
        r = tj.tensor(np.ones(1024, np.float32), device=PLACES[3])
        jax.block_until_ready(r.array)
        freed = [k for k in _shards(r.array) if k[0] != 3]
        x = r.to(DEVS[3])
        assert (3, x.array.unsafe_buffer_pointer()) in _shards(r.array)  # the case: shared
        assert len(_tracked(tl)) == 1
        assert tl._find_key((freed[0],)) is not None  # r's allocation: the buffer's
        tj.dispose(r)
        del r
        gc.collect()
        alone = {str(DEVS[3]): 4096}
        assert _replayed_per_device(tl) == _names(tj.memory().bytes_per_device) == alone
        assert tl._find_key((freed[0],)) is None  # freed: its address is anyone's
        tj.dispose(x)


@eight
def test_an_output_over_a_donated_buffer_is_not_taken_for_the_old_buffers_views() -> None:
    """The shard views of a sharded Tensor (read as ``addressable_shards``) are views of its
    buffer; donated, its addresses are the output's. The output's own shard views were taken
    for plain arrays (the donated buffer's index entries, by shard, were never replaced)."""
    with tj.timeline(sample=None) as tl:
        t = tj.tensor(np.ones(1024, np.float32), device=PLACES[2])
        jax.block_until_ready(t.array)
        before = _shards(t.array)  # shard views
        tl.mark()
        out = DOUBLE(t)
        jax.block_until_ready(out.array)
        assert _shards(out.array).keys() == before.keys()  # the case: the addresses reused
        tl.mark()  # looks at the output's views
        replay = tl.live_at(time.perf_counter())
        assert [(r.scope, r.bytes) for r in replay] == [("", 4096)]
        assert _replayed_per_device(tl) == _names(tj.memory().bytes_per_device)
        tj.dispose(out)


@eight
def test_an_allocation_two_records_hold_parts_of_counts_once_at_its_largest() -> None:
    """On CPU, ``r.to(sharded)`` of a replicated ``r`` makes its shards as views into ``r``'s
    first copy: the shard on that device starts where the copy does (one buffer: grouped).
    That allocation counts once, with the copy's bytes, whichever record is read first."""
    from tidyjax import _registry
    from tidyjax._census import group_spread

    r = tj.tensor(np.ones(1024, np.float32), device=PLACES[3])
    s = r.to(PLACES[2])
    jax.block_until_ready(s.array)
    first = (0, r.array.addressable_shards[0].data.unsafe_buffer_pointer())
    assert first in _shards(s.array) and _shards(s.array)[first][1] == 512  # the case
    recs = [_registry.lookup(r.array), _registry.lookup(s.array)]
    truth: dict[Key, tuple[str, int]] = {}
    _merge(truth, _shards(r.array))
    _merge(truth, _shards(s.array))
    want = _per_device(truth)
    assert want[str(DEVS[0])] == 4096 and want[str(DEVS[1])] == 4096 + 512
    assert _names(group_spread(recs)) == _names(group_spread(recs[::-1])) == want
    assert _names(tj.memory().bytes_per_device) == want
    tj.dispose([r, s])


@eight
def test_a_callers_array_a_sharded_tensor_was_sliced_from_is_a_plain_array_again_whole() -> None:
    """On CPU, ``t.to(sharded)`` of a Tensor over the caller's replicated array slices it without
    a copy: one buffer (grouped). Once ``t`` goes, the caller's array is a plain array again,
    whole, as ``memory()`` counts it; the timeline took it for views of the sharded Tensor's
    buffer (none of its bytes counted), and once that Tensor went too, took a shard view of the
    array for a new one (its index held one entry per allocation)."""
    gc.collect()
    base = _names(tj.memory().untracked_per_device)
    with tj.timeline(sample=None) as tl:
        raw = jax.device_put(np.ones(1024, np.float32), PLACES[3])  # the caller's, replicated
        t = tj.tensors(raw)
        s = t.to(PLACES[2])
        jax.block_until_ready(s.array)
        assert (0, raw.addressable_shards[0].data.unsafe_buffer_pointer()) in _shards(s.array)
        tl.mark()  # raw's shard views (read just now): views of the buffer
        for step in ("t", "s"):  # t goes, then s
            tj.dispose(t if step == "t" else s)
            tl.mark()
            plain = [r for r in tl.live_at(time.perf_counter()) if r.scope == "<untracked>"]
            assert [(r.shape, r.bytes) for r in plain] == [((1024,), 4096)], step
            info = tj.memory()
            grew = {d: b - base.get(d, 0) for d, b in _names(info.untracked_per_device).items()}
            assert {d: b for d, b in grew.items() if b} == _spread([raw]), step
            assert _replayed_per_device(tl) == _names(info.bytes_per_device), step
    del raw


def _aligned(n: int) -> np.ndarray:
    """A host array of ``n`` float32 ones at a 64-byte boundary: XLA:CPU puts it on a device
    without a copy (the device buffer is the host memory itself)."""
    raw = np.empty(n + 16, np.float32)
    start = (-raw.ctypes.data % 64) // 4
    host = raw[start : start + n]
    host[:] = 1
    return host


@eight
def test_allocations_at_one_address_on_two_devices_are_two_for_the_timeline() -> None:
    """On CPU two devices' buffers may have one address (an aligned host array put on each
    without a copy; an array moved to another device keeping its memory): two allocations, as
    the registry and ``memory()`` count them. The timeline looked them up by address alone:
    the newer one's took the older's place in its index, and once it was freed, an object over
    the older one's buffer was taken for a new plain array."""
    host = _aligned(256)
    with tj.timeline(sample=None) as tl:
        a = tj.adopt(jax.device_put(host, DEVS[0]))
        b = tj.adopt(jax.device_put(host, DEVS[3]))
        assert a.array.unsafe_buffer_pointer() == b.array.unsafe_buffer_pointer()  # the case
        assert len(_tracked(tl)) == 2  # looked up: both indexed
        tj.dispose(b)
        view = jax.device_put(a.array, DEVS[0])  # a new object over a's buffer
        assert view is not a.array and not view.is_deleted()
        assert [(r.scope, r.devices) for r in _tracked(tl)] == [("", (str(DEVS[0]),))]
        assert [r for r in tl.live_at(time.perf_counter()) if r.scope == "<untracked>"] == []
        assert _replayed_per_device(tl) == _names(tj.memory().bytes_per_device)
        tj.dispose(a)
    assert view.is_deleted()  # a's buffer: deleted with it


@eight
def test_donating_a_buffer_a_replicated_tensor_holds_as_a_shard_disposes_that_tensor() -> None:
    """``x.to(replicated)`` of a one-device ``x`` keeps ``x``'s buffer as its shard there: when
    ``tidyjax.jit`` donates ``x``, that Tensor is over a consumed shard (JAX does not mark its
    array deleted; waiting for it raises). It is disposed with the donation's reason, as an
    alias JAX deleted with the donated buffer is; it stayed live, a failed allocation of 0 B."""
    x = tj.tensor(np.ones(256, np.float32), device=DEVS[3])
    r = x.to(PLACES[3])  # its shard on cpu:3 is x's buffer
    out = DOUBLE(x)
    try:
        assert x.is_disposed
        assert r.is_disposed, "a live Tensor over a donated shard"
        with pytest.raises(tj.DisposedError, match="donat"):
            r.numpy()
        assert tj.memory().num_data_buffers == 1  # out
    finally:
        tj.dispose([r, out])


# -- the same under eight devices -----------------------------------------------------------------


@pytest.mark.skipif(EIGHT or UNDER_EIGHT, reason="runs itself")
def test_under_eight_devices() -> None:
    out = run_under_eight_devices(__file__, "-x")
    assert not re.search(r"\d+ failed", out) and ", 1 skipped" in out  # only this test
