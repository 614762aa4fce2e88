"""A model-based test: random programs of tidyjax calls against a model of what must be alive.

Rules create tensors, run ops and a jitted function of three outputs (one batch), alias buffers
(clone, same-dtype astype, ``x[...]``, a raw ``jax.device_put`` to the same device, by ``adopt``
or through a pytree rebuild or ``tensors()``), dispose, keep, open and close (nested, named)
scopes handing out a random subset, raise inside scopes, leave scopes with an inner one still
open, create, assign (also with ``-=``) and dispose Variables, run generators decorated with
``@tidy``, return unregistered containers, and drop references for the garbage collector.
``TestBatchModel`` runs the same programs reading memory() only now and then (a report splits
batches).

The model holds both rules at once. Buffers (groups of Tensors over one buffer): a scope deletes
every buffer it created (or was handed) that nothing returned, kept or held by a Variable
reaches at its exit; a buffer a Variable lets go is its creating scope's again. Tensor objects
(TensorFlow.js): a scope disposes every Tensor object made in it (or handed to it) that is not
returned or kept, even when its buffer lives on. After every step: each live Tensor reads its
expected values and its buffer is not deleted, each disposed one raises DisposedError, and
memory() matches the model's tensors, distinct buffers and bytes. At the end everything is
disposed, memory() is zero and no tidyjax-owned array is left alive.

Run longer with:  python -m pytest tests/test_model.py --hypothesis-profile=long
"""

from __future__ import annotations

import gc
import itertools
import weakref
from dataclasses import dataclass, field

import jax
import numpy as np
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import tidyjax as tj
from tidyjax import DisposedError

SHAPES = [(2,), (3,), (2, 2)]
values = st.sampled_from(SHAPES).flatmap(
    lambda shape: st.lists(
        st.integers(-8, 8).map(float),
        min_size=int(np.prod(shape)),
        max_size=int(np.prod(shape)),
    ).map(lambda xs, shape=shape: np.array(xs, np.float32).reshape(shape))
)
TOP = -1  # owner of buffers (and Tensor objects) outside every scope
KEPT = "kept"
VARIABLE = "variable"
# A dead group's owner is None. Scopes are numbered (serials), so a scope that exited is never
# confused with a later one at the same depth.


@dataclass
class Entry:
    tensor: tj.Tensor
    expected: np.ndarray
    group: int  # tensors with the same group share one device buffer
    variable: bool = False
    obj_scope: int = TOP  # the scope that disposes this object at its exit (TensorFlow.js)
    kept: bool = False  # tidyjax.keep(t) was called on this object


@dataclass
class Model:
    live: dict[int, Entry] = field(default_factory=dict)
    disposed: list[tj.Tensor] = field(default_factory=list)
    groups: itertools.count = field(default_factory=itertools.count)
    owner: dict[int, object] = field(default_factory=dict)  # group -> serial, TOP, KEPT, VARIABLE
    home: dict[int, object] = field(default_factory=dict)  # group -> its owner before VARIABLE
    nvars: dict[int, int] = field(default_factory=dict)  # group -> live Variables holding it
    parent: dict[int, int] = field(default_factory=dict)  # serial -> parent serial or TOP
    closed: set[int] = field(default_factory=set)


_THREE = tj.jit(lambda a: (a + 1.0, a * 2.0, -a))  # a call whose outputs form one batch


class Box:
    """A container JAX does not know (not a registered pytree)."""

    def __init__(self, items):
        self.items = items


def _alive(a) -> bool:
    return a is not None and not a.is_deleted()


class TidyjaxMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.model = Model()
        self.scopes: list[tuple[int, tj.Scope]] = []
        self.serials = itertools.count()
        self.arrays: list = []  # weak references to every array tidyjax made here

    # -- helpers ---------------------------------------------------------------------------

    def current(self) -> int:
        return self.scopes[-1][0] if self.scopes else TOP

    def add(self, t: tj.Tensor, expected: np.ndarray, group: int | None = None, variable=False):
        m = self.model
        if group is None:
            group = next(m.groups)
            m.owner[group] = VARIABLE if variable else self.current()
            if variable:
                m.home[group], m.nvars[group] = TOP, 1
        elif variable:
            if m.owner[group] != VARIABLE:
                m.home[group] = m.owner[group]
                m.owner[group] = VARIABLE
            m.nvars[group] = m.nvars.get(group, 0) + 1
        entry = Entry(t, np.asarray(expected, np.float32), group, variable)
        entry.obj_scope = TOP if variable else self.current()
        m.live[t.id] = entry
        self.arrays.append(weakref.ref(t.array))
        return t

    def pick(self, data, *, variables=None):
        ids = sorted(
            i for i, e in self.model.live.items() if variables is None or e.variable == variables
        )
        return self.model.live[data.draw(st.sampled_from(ids))] if ids else None

    def kill(self, entry: Entry) -> None:
        del self.model.live[entry.tensor.id]
        self.model.disposed.append(entry.tensor)

    def holders(self, group: int) -> list[Entry]:
        return [e for e in self.model.live.values() if e.group == group]

    def let_go(self, group: int) -> None:
        """A Variable stopped holding ``group``: its buffer is its home scope's again."""
        m = self.model
        m.nvars[group] -= 1
        if m.nvars[group] == 0 and m.owner[group] == VARIABLE:
            home = m.home.get(group, TOP)
            while isinstance(home, int) and home in m.closed:
                home = m.parent[home]
            m.owner[group] = home

    def release(self, group: int) -> None:
        """One holder of ``group`` went; the buffer is deleted with its last holder."""
        if not self.holders(group):
            self.model.owner[group] = None

    def exit_model(self, serial: int, handed: set[int]) -> None:
        """The model's view of scope ``serial`` exiting with the Tensors ``handed`` out."""
        m = self.model
        parent = m.parent[serial]
        escaping = {m.live[i].group for i in handed if i in m.live}
        for g in [g for g, o in m.owner.items() if o == serial]:
            m.owner[g] = parent if g in escaping else None
        for i, e in list(m.live.items()):
            if m.owner[e.group] is None:  # the buffer was deleted: every Tensor on it is gone
                self.kill(e)
            elif e.obj_scope == serial and not e.kept and not e.variable:
                if i in handed:
                    e.obj_scope = parent  # the parent's object now
                else:
                    self.kill(e)  # TensorFlow.js: not returned, so disposed (object only)
        m.closed.add(serial)

    # -- rules -----------------------------------------------------------------------------

    @rule(x=values)
    def create(self, x):
        self.add(tj.tensor(x), x)

    @rule(data=st.data(), op=st.sampled_from(["add", "mul", "neg", "square", "sum"]))
    @precondition(lambda self: self.model.live)
    def compute(self, data, op):
        e = self.pick(data)
        t, x = e.tensor, e.expected
        out, want = {
            "add": lambda: (t + 1.5, x + 1.5),
            "mul": lambda: (t * t, x * x),
            "neg": lambda: (-t, -x),
            "square": lambda: (t.square(), x**2),
            "sum": lambda: (t.sum(), np.float32(x.sum())),
        }[op]()
        self.add(out, want)

    @rule(data=st.data())
    @precondition(lambda self: self.model.live)
    def jitted(self, data):
        e = self.pick(data)
        outs = _THREE(e.tensor)
        for out, want in zip(outs, (e.expected + 1.0, e.expected * 2.0, -e.expected), strict=True):
            self.add(out, want)

    @rule(
        data=st.data(),
        kind=st.sampled_from(
            ["clone", "astype", "ellipsis", "adopt_put", "raw_put", "tree_put", "tensors_put"]
        ),
    )
    @precondition(lambda self: self.model.live)
    def alias(self, data, kind):
        e = self.pick(data)
        t = e.tensor
        dev = jax.devices()[0]
        out = {
            "clone": t.clone,
            "astype": lambda: t.astype(t.dtype),
            "ellipsis": lambda: t[...],
            "adopt_put": lambda: tj.adopt(jax.device_put(t.array, dev)),
            # Raw JAX makes a second array object over the same buffer: tidyjax must see it.
            "raw_put": lambda: jax.device_put(t, dev),
            "tree_put": lambda: jax.tree.map(lambda a: jax.device_put(a, dev), [t])[0],
            "tensors_put": lambda: tj.tensors(jax.device_put(tj.arrays([t]), dev))[0],
        }[kind]()
        self.add(out, e.expected, group=e.group)

    @rule(data=st.data())
    @precondition(lambda self: self.model.live)
    def dispose(self, data):
        e = self.pick(data)
        e.tensor.dispose()
        self.kill(e)
        if e.variable:
            self.let_go(e.group)
        self.release(e.group)

    @rule(data=st.data())
    @precondition(lambda self: self.model.live)
    def keep(self, data):
        e = self.pick(data, variables=False)
        if e is not None:
            tj.keep(e.tensor)
            e.kept = True
            if self.model.owner[e.group] == VARIABLE:
                self.model.home[e.group] = KEPT
            else:
                self.model.owner[e.group] = KEPT

    @rule(name=st.sampled_from([None, "outer", "step", "inner"]))
    @precondition(lambda self: len(self.scopes) < 4)
    def enter_scope(self, name):
        scope = tj.tidy(name) if name else tj.tidy()
        serial = next(self.serials)
        self.model.parent[serial] = self.current()
        scope.__enter__()
        self.scopes.append((serial, scope))

    @rule(data=st.data(), boxed=st.booleans())
    @precondition(lambda self: self.scopes)
    def exit_scope(self, data, boxed):
        # Draw first: hypothesis may stop an example inside a draw, and the scope must then
        # still be on self.scopes for teardown to exit it.
        candidates = sorted(self.model.live)
        handed = data.draw(st.lists(st.sampled_from(candidates), unique=True)) if candidates else []
        serial, scope = self.scopes.pop()
        if handed:
            values = [self.model.live[i].tensor for i in handed]
            scope.keep(Box(values) if boxed else values)  # an unregistered container too
        scope.__exit__(None, None, None)
        self.exit_model(serial, set(handed))

    @rule()
    @precondition(lambda self: len(self.scopes) >= 2)
    def exception_leaves_outer_scope_with_inner_open(self):
        inner_serial, _ = self.scopes.pop()
        outer_serial, outer = self.scopes.pop()
        with pytest.raises(KeyError, match="mine"):
            try:
                raise KeyError("mine")
            except KeyError as e:
                outer.__exit__(KeyError, e, None)  # the user's error must win
                raise
        self.exit_model(inner_serial, set())
        self.exit_model(outer_serial, set())

    @rule(x=values)
    def raise_inside_scope(self, x):
        made = []
        with pytest.raises(ValueError, match="planned"), tj.tidy("failing"):
            a = tj.tensor(x)
            made += [a, a * 2]
            raise ValueError("planned")
        for t in made:
            assert t.is_disposed
            self.model.disposed.append(t)

    @rule(data=st.data(), x=values, decorated=st.booleans())
    @precondition(lambda self: self.model.live)
    def generator(self, data, x, decorated):
        e = self.pick(data)

        def body(t):
            with tj.tidy("gen"):
                yield t * 2
                yield t * 3

        @tj.tidy
        def decorated_body(t):
            yield t * 2
            yield t * 3

        gen = (decorated_body if decorated else body)(e.tensor)
        first = next(gen)
        self.add(tj.tensor(x), x)  # made by the caller while the generator is suspended
        second = next(gen)
        gen.close()
        if decorated:  # what it yields is handed to the caller's scope
            self.add(first, e.expected * 2)
            self.add(second, e.expected * 3)
        else:  # its own scope freed what it made, when it was closed
            assert first.is_disposed and second.is_disposed
            self.model.disposed += [first, second]

    @rule(data=st.data(), x=values, from_tensor=st.booleans())
    def create_variable(self, data, x, from_tensor):
        e = self.pick(data, variables=False) if from_tensor else None
        if e is not None:
            self.add(tj.Variable(e.tensor), e.expected, group=e.group, variable=True)
        else:
            self.add(tj.Variable(x), x, variable=True)

    @rule(data=st.data(), how=st.sampled_from(["value", "through_scope", "in_place"]))
    @precondition(lambda self: any(e.variable for e in self.model.live.values()))
    def assign_variable(self, data, how):
        e = self.pick(data, variables=True)
        v = e.tensor
        new = e.expected * 2 + 1
        old_group = e.group
        e.group = next(self.model.groups)  # no longer a holder of the old buffer
        self.model.owner[e.group], self.model.nvars[e.group] = VARIABLE, 1
        if how == "through_scope":
            serial = next(self.serials)
            self.model.parent[serial] = self.current()
            with tj.tidy("assign"):
                v.assign(v * 2 + 1)  # the value is a scope temporary
            self.model.home[e.group] = serial
            self.model.closed.add(serial)
        elif how == "in_place":
            v *= 2.0
            v += 1.0
            assert v is e.tensor and isinstance(v, tj.Variable)
            self.model.home[e.group] = self.current()
        else:
            v.assign(new)
            self.model.home[e.group] = TOP
        self.let_go(old_group)
        self.release(old_group)
        e.expected = new
        self.arrays.append(weakref.ref(v.array))

    @rule(data=st.data())
    @precondition(lambda self: self.model.live)
    def drop_reference(self, data):
        e = self.pick(data)
        del self.model.live[e.tensor.id]
        del e
        gc.collect()

    # -- invariants ------------------------------------------------------------------------

    @invariant()
    def live_tensors_read_their_values(self):
        for e in self.model.live.values():
            assert not e.tensor.is_disposed
            assert not e.tensor.array.is_deleted()
            np.testing.assert_array_equal(e.tensor.numpy(), e.expected)

    @invariant()
    def disposed_tensors_raise(self):
        for t in self.model.disposed[-8:]:
            assert t.is_disposed
            with pytest.raises(DisposedError):
                t.numpy()

    @invariant()
    def disposed_tensors_hold_no_live_array(self):
        # A disposed Tensor that kept its array would keep the buffer alive for as long as
        # the caller holds the Tensor, uncounted (a deleted array holds nothing).
        for t in self.model.disposed:
            arr = t._array
            assert not (isinstance(arr, jax.Array) and not arr.is_deleted()), t

    @invariant()
    def memory_matches_the_model(self):
        m = tj.memory(scan_untracked=False)  # no gc: tidyjax makes no reference cycles
        groups = {}
        for e in self.model.live.values():
            groups[e.group] = e.expected.nbytes
        assert m.num_tensors == len(self.model.live)
        assert m.num_data_buffers == len(groups)
        assert m.num_bytes == sum(groups.values())

    def teardown(self):
        from tidyjax._context import CURRENT

        self.scopes.clear()
        while (scope := CURRENT.get()) is not None:  # unwind even after a failed step
            scope.__exit__(None, None, None)
        tj.dispose([e.tensor for e in self.model.live.values()])
        self.model.live.clear()
        gc.collect()
        m = tj.memory()
        assert (m.num_tensors, m.num_data_buffers, m.num_bytes) == (0, 0, 0)
        ours = {id(a) for a in map(weakref.ref.__call__, self.arrays) if _alive(a)}
        assert not [a for a in jax.live_arrays() if id(a) in ours]


TestTidyjaxModel = TidyjaxMachine.TestCase


class BatchMachine(TidyjaxMachine):
    """The same programs with memory() read only now and then, not after every step.

    A report splits every batch of a jitted call's outputs into records of their own; read after
    every step, it would hide the batch paths (keep, hand-out, exit and dispose of whole batches).
    """

    @invariant()
    def memory_matches_the_model(self):
        pass

    @rule()
    def report(self):
        TidyjaxMachine.memory_matches_the_model(self)


TestBatchModel = BatchMachine.TestCase
