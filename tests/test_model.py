"""A model-based test: random programs of tidyjax calls against a model of what must be alive.

Rules create tensors, run ops, alias buffers, dispose, keep, open and close (nested, named)
scopes handing out a random subset, raise inside scopes, create and assign Variables, and drop
references for the garbage collector. The model follows ownership as the library defines it:
per buffer (a group), with Tensor objects made in a scope on a buffer owned elsewhere (aliases)
disposed, object only, at that scope's exit. After every step: each live Tensor reads its expected
values and its buffer is not deleted, each disposed one raises DisposedError, and memory()
matches the model's tensors, distinct buffers and bytes. At the end everything is disposed,
memory() is zero and no tidyjax-owned array is left alive.

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
TOP = -1  # owner of tensors created outside every scope
KEPT = "kept"
VARIABLE = "variable"
# A dead group's owner is None.


@dataclass
class Entry:
    tensor: tj.Tensor
    expected: np.ndarray
    group: int  # tensors with the same group share one device buffer
    variable: bool = False
    alias_scope: int | None = None  # the depth that disposes this object (not its buffer)
    kept: bool = False  # tidyjax.keep(t) was called on this object


@dataclass
class Model:
    live: dict[int, Entry] = field(default_factory=dict)
    disposed: list[tj.Tensor] = field(default_factory=list)
    groups: itertools.count = field(default_factory=itertools.count)
    owner: dict[int, object] = field(default_factory=dict)  # group -> depth, TOP, KEPT, VARIABLE


class TidyjaxMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.model = Model()
        self.scopes: list[tj.Scope] = []
        self.arrays: list = []  # weak references to every array tidyjax made here

    # -- helpers ---------------------------------------------------------------------------

    def depth(self) -> int:
        return len(self.scopes) - 1 if self.scopes else TOP

    def add(self, t: tj.Tensor, expected: np.ndarray, group: int | None = None, variable=False):
        entry = Entry(t, np.asarray(expected, np.float32), -1, variable)
        if group is None:
            group = next(self.model.groups)
            self.model.owner[group] = VARIABLE if variable else self.depth()
        elif variable:
            self.model.owner[group] = VARIABLE
        elif self.depth() != TOP and self.model.owner[group] != self.depth():
            entry.alias_scope = self.depth()
        entry.group = group
        self.model.live[t.id] = entry
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

    @rule(data=st.data(), kind=st.sampled_from(["clone", "astype", "ellipsis", "device_put"]))
    @precondition(lambda self: self.model.live)
    def alias(self, data, kind):
        e = self.pick(data)
        t = e.tensor
        out = {
            "clone": t.clone,
            "astype": lambda: t.astype(t.dtype),
            "ellipsis": lambda: t[...],
            "device_put": lambda: tj.adopt(jax.device_put(t.array, jax.devices()[0])),
        }[kind]()
        self.add(out, e.expected, group=e.group)

    @rule(data=st.data())
    @precondition(lambda self: self.model.live)
    def dispose(self, data):
        e = self.pick(data)
        e.tensor.dispose()
        self.kill(e)

    @rule(data=st.data())
    @precondition(lambda self: self.model.live)
    def keep(self, data):
        e = self.pick(data, variables=False)
        if e is not None:
            tj.keep(e.tensor)
            e.kept = True
            if self.model.owner[e.group] != VARIABLE:
                self.model.owner[e.group] = KEPT

    @rule(name=st.sampled_from([None, "outer", "step", "inner"]))
    @precondition(lambda self: len(self.scopes) < 4)
    def enter_scope(self, name):
        scope = tj.tidy(name) if name else tj.tidy()
        scope.__enter__()
        self.scopes.append(scope)

    @rule(data=st.data())
    @precondition(lambda self: self.scopes)
    def exit_scope(self, data):
        # Draw first: hypothesis may stop an example inside a draw, and the scope must then
        # still be on self.scopes for teardown to exit it.
        candidates = sorted(self.model.live)
        handed = data.draw(st.lists(st.sampled_from(candidates), unique=True)) if candidates else []
        depth = self.depth()
        scope = self.scopes.pop()
        if handed:
            scope.keep(*[self.model.live[i].tensor for i in handed])
        scope.__exit__(None, None, None)
        owner = self.model.owner
        escaping = {self.model.live[i].group for i in handed}
        for g in [g for g, o in owner.items() if o == depth]:
            owner[g] = (depth - 1 if depth > 0 else TOP) if g in escaping else None
        for i, e in list(self.model.live.items()):
            if owner[e.group] is None:  # the buffer was deleted: every Tensor on it is disposed
                self.kill(e)
            elif e.alias_scope == depth:
                if i in handed or e.kept:
                    e.alias_scope = None
                else:
                    self.kill(e)

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

    @rule(data=st.data(), x=values, from_tensor=st.booleans())
    def create_variable(self, data, x, from_tensor):
        e = self.pick(data, variables=False) if from_tensor else None
        if e is not None:
            before = self.model.owner[e.group]
            self.add(tj.Variable(e.tensor), e.expected, group=e.group, variable=True)
            if isinstance(before, int) and before >= 0 and e.alias_scope is None:
                e.alias_scope = before  # that scope still disposes the Tensor object
        else:
            self.add(tj.Variable(x), x, variable=True)

    @rule(data=st.data(), through_scope=st.booleans())
    @precondition(lambda self: any(e.variable for e in self.model.live.values()))
    def assign_variable(self, data, through_scope):
        e = self.pick(data, variables=True)
        v = e.tensor
        new = e.expected * 2 + 1
        if through_scope:
            with tj.tidy("assign"):
                v.assign(v * 2 + 1)  # the value is a scope temporary
        else:
            v.assign(new)
        e.expected, e.group = new, next(self.model.groups)
        self.model.owner[e.group] = VARIABLE
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
        ours = {id(a) for ref in self.arrays if (a := ref()) is not None and not a.is_deleted()}
        assert not [a for a in jax.live_arrays() if id(a) in ours]


TestTidyjaxModel = TidyjaxMachine.TestCase
