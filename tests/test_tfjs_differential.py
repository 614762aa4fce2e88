"""Differential test: tidyjax's tidy/keep/dispose/clone/Variable books against TensorFlow.js 4.22.

Random programs of the statements both libraries have run in TF.js itself
(``tests/tfjs/run_program.js``: Node, ``@tensorflow/tfjs`` 4.22.0, the pure-JS CPU backend, one
process for all programs) and in tidyjax. After *every* statement the two must agree on
``numTensors``, ``numDataBuffers``, which of the program's tensors are still alive and whether
the statement was rejected. Passing proves that, on these programs, tidyjax frees exactly what
TF.js frees, when TF.js frees it, and refuses what TF.js refuses.

The statements (JSON objects, ``op`` first; TF.js / tidyjax):

- ``create``, ``unary``, ``binary``, ``clone``: ``tf.tensor``, ``tf.neg``/``tf.square``,
  ``tf.add``/``tf.mul``, ``x.clone()`` / the same in tidyjax, on live tensors;
- ``dispose``: ``x.dispose()``, also of a tensor already disposed (a no-op in both), and of a
  Variable already disposed when that is a no-op in TF.js too (see :meth:`TfjsModel._dispose`);
- ``dispose_tree``: ``tf.dispose({...})`` / ``tj.dispose({...})`` of nested lists and dicts of
  tensors, live or not;
- ``keep``: ``tf.keep(x)`` / ``tj.keep(x)`` of any tensor: live, made in an enclosing scope,
  returned by a scope, or already disposed (a no-op in both);
- ``try_clone``: ``x.clone()`` of a disposed tensor, which both must reject (TF.js: "Tensor is
  disposed", tidyjax: ``DisposedError``) without touching the books; the snapshot records that
  it was rejected;
- ``enter`` / ``exit``: a scope; its result is nothing, a tensor, a list, or nested lists and
  dicts of tensors (live or disposed, the scope's own or outer ones, repeated or not);
- ``variable``, ``assign`` (also ``v.assign(v)`` where TF.js allows it), ``dispose`` of a
  Variable, ``dispose_variables``: ``tf.variable(x)``, ``v.assign(x)``, ``v.dispose()``,
  ``tf.disposeVariables()`` / ``tj.Variable(x)``, ``v.assign(x)``, ``v.dispose()``,
  ``tj.dispose_variables()``.

A TF.js scope is the engine's own ``startScope(name)`` / ``endScope(result)``, exactly what
``tf.tidy`` runs around its function (``result`` is what the function returns); a tidyjax scope
is ``tj.tidy(name)`` entered and, at exit, ``scope.keep(result)`` (a scope's keep hands values
out exactly as returning them would; a list result is passed as ``scope.keep(*items)``) before
``__exit__``. TF.js has no per-scope keep, so no program hands a value out early.

The generator knows which names are alive from :class:`TfjsModel`, a transcription of TF.js's
``engine.js`` for these statements (``startScope``, ``endScope``, ``track``, ``keep``,
``disposeTensor``, ``disposeVariable``, ``makeVariable``, ``Variable.assign``,
``disposeVariables``, ``getTensorsInContainer``, ``Tensor.clone``'s ``throwIfDisposed``), so
programs hold only statements TF.js accepts and keeps its books right on.
``test_model_is_tfjs`` checks that model against real TF.js, statement by statement. On a
mismatch, ``test_all_programs_agree`` shrinks the first failing program and prints it as
runnable Python with TF.js's counts after each line.

tidyjax runs with the garbage collector off and every Tensor held to the end of the program (as
the JS side holds its tensors), so only tidyjax itself frees anything, and the counts are
reproducible.

Needs ``node`` on PATH and ``npm ci --prefix tests/tfjs``; skipped without them, failed in CI
(the environment variable ``CI`` set). ``python -m pytest tests/test_tfjs_differential.py``.
"""

from __future__ import annotations

import gc
import itertools
import json
import os
import random
import shutil
import subprocess
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import tidyjax as tj
from tidyjax._context import CURRENT

TFJS_DIR = Path(__file__).resolve().parent / "tfjs"
RUNNER = TFJS_DIR / "run_program.js"
TFJS_VERSION = "4.22.0"

SEED_BASE = 20_240  # program i is generate(SEED_BASE + i): fixed, so every run sees the same
NUM_PROGRAMS = 500
STATEMENTS = 36
MAX_DEPTH = 3

Statement = dict[str, Any]
Program = list[Statement]
Tree = Any  # a scope's result or a dispose_tree argument: a name, or lists and dicts of Trees
# numTensors, numDataBuffers, live names (sorted), whether the statement was rejected
Snapshot = tuple[int, int, tuple[str, ...], bool]


@dataclass
class Run:
    """What one library did with one program: a snapshot after each statement that ran, and the
    error that stopped it, as (statement index, message)."""

    trace: list[Snapshot]
    error: tuple[int, str] | None = None


class InvalidProgramError(Exception):
    """A statement TF.js would reject (or mishandle): the generator never emits one."""


def _leaves(tree: Tree) -> Iterator[str]:
    """The names in ``tree``, depth first, in order (``getTensorsInContainer``'s walk)."""
    if tree is None:
        return
    if isinstance(tree, str):
        yield tree
    elif isinstance(tree, list):
        for item in tree:
            yield from _leaves(item)
    elif isinstance(tree, dict):
        for item in tree.values():
            yield from _leaves(item)
    else:
        raise TypeError(f"not a tree of names: {tree!r}")


def _result_names(st: Statement) -> list[str]:
    return list(_leaves(st.get("result")))


# -- TF.js, transcribed --------------------------------------------------------------------------


class _T:
    """A TF.js Tensor object: its data id, the scope that tracks it, its flags."""

    __slots__ = ("data", "disposed", "kept", "registered", "scope", "variable")

    def __init__(self, data: int, variable: bool = False) -> None:
        self.data = data
        self.variable = variable
        self.scope: int | None = None  # tensor.scopeId
        self.kept = False
        self.disposed = False  # tensor.isDisposedInternal
        self.registered = variable  # in engine.state.registeredVariables


class TfjsModel:
    """TF.js 4.22's engine (``tfjs-core/dist/engine.js``) and CPU backend reference counts, for
    the statements the programs use. Raises :class:`InvalidProgramError` where TF.js would throw
    (other than the rejection ``try_clone`` records) or where its books would go wrong
    (disposing a Variable again while its data buffer lives decrements its count again); the
    model's state is undefined after that."""

    def __init__(self) -> None:
        self.env: dict[str, _T] = {}
        self.refs: dict[int, int] = {}  # the backend's refCount per data id
        self.info: set[int] = set()  # engine.state.tensorInfo: one entry per data buffer
        self.num_tensors = 0
        self.stack: list[tuple[int, list[_T]]] = []  # (scope id, its track list)
        self._ids = itertools.count()

    # state

    @property
    def depth(self) -> int:
        return len(self.stack)

    def alive(self, name: str) -> bool:
        t = self.env[name]
        return not t.disposed and (not t.variable or t.registered)

    def live(self) -> list[str]:
        return [n for n in self.env if self.alive(n)]

    def dead(self) -> list[str]:
        return [n for n in self.env if not self.alive(n)]

    def disposable(self, name: str) -> bool:
        """Whether ``name.dispose()`` is valid now (see :meth:`_dispose`)."""
        t = self.env[name]
        return not t.variable or self.alive(name) or t.data not in self.info

    def snapshot(self, rejected: bool = False) -> Snapshot:
        return self.num_tensors, len(self.info), tuple(sorted(self.live())), rejected

    # engine.js

    def _track(self, t: _T) -> None:  # Engine.track
        if self.stack:
            t.scope = self.stack[-1][0]
            self.stack[-1][1].append(t)

    def _track_tensor(self, t: _T) -> None:  # Engine.trackTensor
        self.num_tensors += 1
        self.info.add(t.data)
        if not t.variable:
            self._track(t)

    def _new(self) -> _T:  # makeTensor: backend.write (refCount 1), then trackTensor
        data = next(self._ids)
        self.refs[data] = 1
        t = _T(data)
        self._track_tensor(t)
        return t

    def _dispose_tensor(self, t: _T) -> None:  # Engine.disposeTensor + backend.disposeData
        if t.data not in self.info:
            return
        self.num_tensors -= 1
        self.refs[t.data] -= 1
        if self.refs[t.data] == 0:
            del self.refs[t.data]
            self.info.discard(t.data)

    def _dispose(self, t: _T) -> None:
        """``Tensor.dispose`` (returns at once if ``isDisposed``) and ``Variable.dispose``
        (``Engine.disposeVariable`` whatever its state: ``disposeTensor``, then unregister).

        A Variable disposed again, or after ``disposeVariables``, goes through
        ``disposeTensor`` again: a no-op once its data id has left ``tensorInfo``, but while
        another tensor keeps that buffer alive it decrements ``numTensors`` and the buffer's
        refCount a second time. TF.js's books go wrong there: invalid."""
        if t.variable:
            if (t.disposed or not t.registered) and t.data in self.info:
                raise InvalidProgramError(
                    "TF.js decrements a Variable's count again on each dispose while its data "
                    "buffer lives"
                )
            self._dispose_tensor(t)
            t.registered = False
        elif t.disposed:
            return
        else:
            self._dispose_tensor(t)
        t.disposed = True

    def _defined(self, name: str) -> _T:
        if name not in self.env:
            raise InvalidProgramError(f"{name} is not defined")
        return self.env[name]

    def _get(self, name: str) -> _T:
        t = self._defined(name)
        if not self.alive(name):
            raise InvalidProgramError(f"{name} is disposed")
        return t

    def _container(self, tree: Tree) -> list[_T]:
        """``getTensorsInContainer``: each tensor once (its ``seen`` set), in walk order."""
        out: list[_T] = []
        for name in _leaves(tree):
            t = self._defined(name)
            if not any(t is s for s in out):
                out.append(t)
        return out

    def _define(self, name: str, t: _T) -> None:
        if name in self.env:
            raise InvalidProgramError(f"{name} is defined twice")
        self.env[name] = t

    def _clone(self, x: _T) -> _T:  # the Identity kernel: backend.incRef, then a Tensor on x's data
        self.refs[x.data] += 1
        t = _T(x.data)
        self._track_tensor(t)
        return t

    def step(self, st: Statement) -> bool:
        """Run one statement; True if TF.js rejected it (only ``try_clone`` may)."""
        op = st["op"]
        if op == "create":
            self._define(st["out"], self._new())
        elif op in ("unary", "binary"):
            for name in (st["x"], st["y"]) if op == "binary" else (st["x"],):
                self._get(name)
            self._define(st["out"], self._new())
        elif op == "clone":
            self._define(st["out"], self._clone(self._get(st["x"])))
        elif op == "try_clone":
            x = self._defined(st["x"])
            if x.disposed:  # Tensor.clone: throwIfDisposed, before anything else
                return True
            # a Variable after disposeVariables is not isDisposed: its clone reads freed data
            self._define(st["out"], self._clone(self._get(st["x"])))
        elif op == "dispose":
            self._dispose(self._defined(st["x"]))
        elif op == "dispose_tree":  # tf.dispose(container)
            for t in self._container(st["xs"]):
                self._dispose(t)
        elif op == "keep":  # Engine.keep: sets the flag, whatever the tensor's state
            self._defined(st["x"]).kept = True
        elif op == "enter":  # Engine.startScope
            self.stack.append((next(self._ids), []))
        elif op == "exit":  # Engine.endScope(result)
            if not self.stack:
                raise InvalidProgramError("exit without an open scope")
            result = self._container(st.get("result"))
            scope_id, tracked = self.stack[-1]
            for t in tracked:
                if not t.kept and not any(t is r for r in result):
                    self._dispose(t)
            self.stack.pop()
            for t in result:  # tracked in the parent if made in the scope and not kept
                if not t.kept and t.scope == scope_id:
                    self._track(t)
        elif op == "variable":  # makeVariable: shares the data; incRef; never tracked by a scope
            x = self._get(st["x"])
            v = _T(x.data, variable=True)
            self._track_tensor(v)
            self.refs[x.data] += 1
            self._define(st["out"], v)
        elif op == "assign":  # disposeTensor(this), then incRef(this) on the new data id
            v, x = self._get(st["var"]), self._get(st["x"])
            if not v.variable:
                raise InvalidProgramError(f"{st['var']} is not a Variable")
            if v.data == x.data and self.refs[v.data] == 1:  # only v.assign(v) gets here
                raise InvalidProgramError(
                    "v.assign(v) frees v's only data buffer before TF.js re-counts it (the CPU "
                    "backend's incRef then throws)"
                )
            self._dispose_tensor(v)
            v.data = x.data
            self._track_tensor(v)
            self.refs[x.data] += 1
        elif op == "dispose_variables":  # disposeVariable of each; isDisposed stays false
            for t in self.env.values():
                if t.variable and t.registered:
                    self._dispose_tensor(t)
                    t.registered = False
        else:
            raise InvalidProgramError(f"unknown statement {st!r}")
        return False

    def run(self, program: Program) -> Run:
        trace = []
        for st in program:
            rejected = self.step(st)
            trace.append(self.snapshot(rejected))
        return Run(trace)


# -- the generator -------------------------------------------------------------------------------


class _Generator:
    """Draws statements at random among those valid now, according to :class:`TfjsModel`."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.model = TfjsModel()
        self.program: Program = []
        self.numbers = itertools.count()
        self.scopes = itertools.count(1)
        self.made: list[list[str]] = [[]]  # the names made in (or handed to) each open scope
        self.returned: list[str] = []  # the names in the results of the scopes exited so far

    def fresh(self, prefix: str = "t") -> str:
        return f"{prefix}{next(self.numbers)}"

    def pick(self, among: Sequence[str] | None = None) -> str:
        """A live name, more often one made in the innermost scope."""
        live = self.model.live() if among is None else list(among)
        local = [n for n in self.made[-1] if n in live]
        if local and self.rng.random() < 0.6:
            return self.rng.choice(local)
        return self.rng.choice(live)

    def emit(self, st: Statement) -> None:
        rejected = self.model.step(st)
        self.program.append(st)
        if "out" in st and not rejected:
            self.made[-1].append(st["out"])
        elif st["op"] == "enter":
            self.made.append([])
        elif st["op"] == "exit":
            inner = self.made.pop()
            names = _result_names(st)
            self.made[-1] += [n for n in dict.fromkeys(names) if n in inner]
            self.returned += names

    # one method per statement kind

    def create(self) -> Statement:
        values = [self.rng.choice([-2.0, -1.0, -0.5, 0.5, 1.0, 1.5, 2.0, 3.0]) for _ in range(2)]
        return {"op": "create", "out": self.fresh(), "values": values}

    def unary(self) -> Statement:
        fn = self.rng.choice(["neg", "square"])
        return {"op": "unary", "fn": fn, "x": self.pick(), "out": self.fresh()}

    def binary(self) -> Statement:
        fn = self.rng.choice(["add", "mul"])
        return {"op": "binary", "fn": fn, "x": self.pick(), "y": self.pick(), "out": self.fresh()}

    def clone(self) -> Statement:
        return {"op": "clone", "x": self.pick(), "out": self.fresh()}

    def try_clone(self) -> Statement:  # of a disposed tensor: both must reject it
        disposed = [n for n, t in self.model.env.items() if t.disposed]
        return {"op": "try_clone", "x": self.rng.choice(disposed), "out": self.fresh()}

    def dispose(self) -> Statement:
        return {"op": "dispose", "x": self.pick()}

    def dispose_again(self) -> Statement:  # a no-op: a disposed tensor, or a Variable's again
        return {"op": "dispose", "x": self.rng.choice(self._dead_disposable())}

    def dispose_variable_again(self) -> Statement:  # a no-op once its buffer is gone
        dead = [n for n in self._dead_disposable() if self.model.env[n].variable]
        return {"op": "dispose", "x": self.rng.choice(dead)}

    def dispose_returned(self) -> Statement:  # a value a scope handed out
        live = set(self.model.live())
        return {"op": "dispose", "x": self.rng.choice([n for n in self.returned if n in live])}

    def dispose_variable(self) -> Statement:
        return {"op": "dispose", "x": self.rng.choice(self._variables())}

    def dispose_tree(self) -> Statement:
        dead = self._dead_disposable()
        live = self.model.live()

        def leaf() -> str:
            if dead and (not live or self.rng.random() < 0.25):
                return self.rng.choice(dead)
            return self.pick()

        return {"op": "dispose_tree", "xs": self._tree(leaf, top=True)}

    def keep(self) -> Statement:
        return {"op": "keep", "x": self.pick()}

    def keep_outer(self) -> Statement:  # made in an enclosing scope (or none)
        return {"op": "keep", "x": self.rng.choice(self._outer())}

    def keep_dead(self) -> Statement:  # a no-op in both
        return {"op": "keep", "x": self.rng.choice(self.model.dead())}

    def enter(self) -> Statement:
        return {"op": "enter", "name": f"s{next(self.scopes)}"}

    def exit(self) -> Statement:
        """Exit the innermost scope with nothing, one name, a list of names, or nested lists and
        dicts of names as its result: mostly the scope's own live tensors, sometimes outer or
        disposed ones, at times one twice."""
        rng, model = self.rng, self.model
        live, dead = model.live(), model.dead()
        if not live and not dead:
            return {"op": "exit", "result": None}

        def leaf() -> str:
            if dead and (not live or rng.random() < 0.12):
                return rng.choice(dead)
            return self.pick()

        r = rng.random()
        result: Tree = None
        if r < 0.3:
            result = leaf()
        elif r < 0.55:
            result = [leaf() for _ in range(rng.randint(2, 3))]
        elif r < 0.8:
            result = self._tree(leaf, top=True)
        return {"op": "exit", "result": result}

    def _tree(self, leaf: Callable[[], str], top: bool = False, depth: int = 0) -> Tree:
        """A name, or (always when ``top``) a list or dict of 1-3 Trees, at most 3 deep."""
        rng = self.rng
        r = rng.random()
        if not top and (depth >= 2 or r < 0.55):
            return leaf()
        items = [self._tree(leaf, depth=depth + 1) for _ in range(rng.randint(1, 3))]
        if rng.random() < 0.5:
            return items
        return dict(zip("abc", items, strict=False))

    def variable(self) -> Statement:
        return {"op": "variable", "x": self.pick(), "out": self.fresh("v")}

    def assign(self) -> Statement:
        var = self.rng.choice([v for v in self._variables() if self._values_for(v)])
        return {"op": "assign", "var": var, "x": self.pick(self._values_for(var))}

    def _values_for(self, var: str) -> list[str]:
        """What ``var`` may be assigned: any live tensor, itself only while another tensor
        shares its buffer (TF.js frees it first, then counts it again)."""
        model = self.model
        shared = model.refs[model.env[var].data] > 1
        return [n for n in model.live() if n != var or shared]

    def dispose_variables(self) -> Statement:
        return {"op": "dispose_variables"}

    def _variables(self) -> list[str]:
        return [n for n in self.model.live() if self.model.env[n].variable]

    def _dead_disposable(self) -> list[str]:
        return [n for n in self.model.dead() if self.model.disposable(n)]

    def _outer(self) -> list[str]:
        inner = set(self.made[-1])
        return [n for n in self.model.live() if n not in inner]

    def options(self) -> list[tuple[float, Callable[[], Statement]]]:
        """The statement kinds valid now, with their weights."""
        model = self.model
        live, dead = model.live(), model.dead()
        out: list[tuple[float, Callable[[], Statement]]] = [(3.0, self.create)]
        if live:
            out += [(1.5, self.unary), (1.5, self.binary), (2.5, self.clone)]
            out += [(2.0, self.dispose), (1.5, self.keep), (0.8, self.variable)]
        if dead:
            out.append((0.4, self.keep_dead))
        if any(model.env[n].disposed for n in dead):
            out.append((0.5, self.try_clone))
        if self._dead_disposable():
            out.append((0.4, self.dispose_again))
            if any(model.env[n].variable for n in self._dead_disposable()):
                out.append((0.6, self.dispose_variable_again))
        if live or self._dead_disposable():
            out.append((0.5, self.dispose_tree))
        if any(model.alive(n) for n in self.returned):
            out.append((0.8, self.dispose_returned))
        if model.depth < MAX_DEPTH:
            out.append((2.0, self.enter))
        if model.depth:
            out.append((1.8, self.exit))
            if self._outer():
                out.append((0.8, self.keep_outer))
        if self._variables():
            out += [(0.25, self.dispose_variables), (0.5, self.dispose_variable)]
            if any(self._values_for(v) for v in self._variables()):
                out.append((1.2, self.assign))
        return out


def generate(seed: int, length: int = STATEMENTS) -> Program:
    """A random valid program of ``length`` statements; every scope is exited by the end."""
    g = _Generator(seed)
    while len(g.program) < length - g.model.depth:
        options = g.options()
        make = g.rng.choices([m for _, m in options], [w for w, _ in options])[0]
        g.emit(make())
    while g.model.depth:
        g.emit(g.exit())
    return g.program


PROGRAMS: list[Program] = [generate(SEED_BASE + i) for i in range(NUM_PROGRAMS)]


def statement_kinds(program: Program) -> Counter[str]:
    """What ``program`` exercises, beyond its ops: counted by replaying it in the model."""
    model = TfjsModel()
    kinds: Counter[str] = Counter()
    returned: set[str] = set()  # names in the results of the scopes exited so far
    for st in program:
        op, env = st["op"], model.env
        kinds[op] += 1
        x = env.get(st.get("x", ""))
        if op == "keep" and x is not None:
            if not model.alive(st["x"]):
                kinds["keep a disposed tensor"] += 1
            elif model.stack and not x.variable and x.scope != model.stack[-1][0]:
                kinds["keep an outer tensor in a scope"] += 1
        if op == "dispose" and x is not None:
            if not model.alive(st["x"]):
                kinds["dispose a disposed Variable" if x.variable else "dispose again"] += 1
            elif x.variable:
                kinds["dispose a Variable"] += 1
            if st["x"] in returned and model.alive(st["x"]):
                kinds["dispose a returned tensor"] += 1
        if op == "assign" and env[st["var"]].data == env[st["x"]].data:
            kinds["assign a Variable its own buffer"] += 1
        tree = st.get("result") if op == "exit" else st.get("xs")
        if tree is not None and not isinstance(tree, str):
            items = tree if isinstance(tree, list) else list(tree.values())
            if isinstance(tree, dict) or any(not isinstance(item, str) for item in items):
                kinds[f"{op} of nested lists and dicts"] += 1
        names = list(_leaves(tree))
        if any(not model.alive(n) for n in names):
            kinds[f"{op} of a disposed tensor"] += 1
        if any(env[n].variable for n in names):
            kinds[f"{op} of a Variable"] += 1
        if len(set(names)) < len(names):
            kinds[f"{op} of a tensor twice"] += 1
        if op == "exit" and any(
            not env[n].variable and env[n].scope != model.stack[-1][0] for n in names
        ):
            kinds["exit with an outer tensor"] += 1
        if model.step(st):
            kinds["clone of a disposed tensor, rejected"] += 1
        if op == "exit":
            returned.update(names)
    return kinds


# -- running ---------------------------------------------------------------------------------------


def _require_tfjs() -> None:
    why = None
    if shutil.which("node") is None:
        why = "node is not on PATH"
    elif not (TFJS_DIR / "node_modules" / "@tensorflow" / "tfjs").is_dir():
        why = f"{TFJS_DIR / 'node_modules' / '@tensorflow' / 'tfjs'} is missing"
    if why is None:
        return
    if os.environ.get("CI"):
        pytest.fail(
            f"{why}: .ci/run must install node and npm (apt-get install nodejs npm) and run "
            "`npm ci --prefix tests/tfjs` (or `npm install --prefix tests/tfjs`) before pytest.",
            pytrace=False,
        )
    pytest.skip(
        f"{why}: install Node.js, then `npm ci --prefix tests/tfjs` for TF.js {TFJS_VERSION}"
    )


def run_tfjs(programs: Sequence[Program]) -> list[Run]:
    """Run every program in one Node process; TF.js's snapshots after each statement."""
    proc = subprocess.run(
        ["node", str(RUNNER)],
        input=json.dumps(programs),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=TFJS_DIR,
        check=False,
    )
    assert proc.returncode == 0, f"{RUNNER.name} failed:\n{proc.stderr}"
    out = json.loads(proc.stdout)
    assert out["version"] == TFJS_VERSION, f"TF.js {out['version']}, expected {TFJS_VERSION}"
    runs = []
    for r in out["results"]:
        trace = [(t, b, tuple(live), rejected) for t, b, live, rejected in r["trace"]]
        err = r["error"]
        runs.append(Run(trace, None if err is None else (err["index"], err["message"])))
    return runs


def _tj_counts() -> tuple[int, int]:
    m = tj.memory(scan_untracked=False)
    return m.num_tensors, m.num_data_buffers


def _tj_tree(env: dict[str, Any], tree: Tree) -> Any:
    """``tree`` with each name replaced by its Tensor: the same nested lists and dicts."""
    if isinstance(tree, str):
        return env[tree]
    if isinstance(tree, list):
        return [_tj_tree(env, item) for item in tree]
    return {k: _tj_tree(env, item) for k, item in tree.items()}


def _tj_step(env: dict[str, Any], scopes: list[Any], st: Statement) -> bool:
    """Run one statement in tidyjax; True if it was rejected (only ``try_clone`` may be)."""
    op = st["op"]
    if op == "create":
        env[st["out"]] = tj.tensor([float(v) for v in st["values"]])
    elif op == "unary":
        env[st["out"]] = getattr(env[st["x"]], st["fn"])()
    elif op == "binary":
        env[st["out"]] = getattr(env[st["x"]], st["fn"])(env[st["y"]])
    elif op == "clone":
        env[st["out"]] = env[st["x"]].clone()
    elif op == "try_clone":
        try:
            out = env[st["x"]].clone()
        except tj.DisposedError:
            return True
        env[st["out"]] = out
    elif op == "dispose":
        env[st["x"]].dispose()
    elif op == "dispose_tree":
        tj.dispose(_tj_tree(env, st["xs"]))
    elif op == "keep":
        tj.keep(env[st["x"]])
    elif op == "enter":
        scope = tj.tidy(st["name"])
        scope.__enter__()
        scopes.append(scope)
    elif op == "exit":
        scope = scopes.pop()
        result = st.get("result")
        if isinstance(result, list) and all(isinstance(n, str) for n in result):
            scope.keep(*(env[n] for n in result))  # as separate values: the same as one list
        elif result is not None:
            scope.keep(_tj_tree(env, result))
        scope.__exit__(None, None, None)
    elif op == "variable":
        env[st["out"]] = tj.Variable(env[st["x"]])
    elif op == "assign":
        env[st["var"]].assign(env[st["x"]])
    elif op == "dispose_variables":
        tj.dispose_variables()
    else:
        raise ValueError(f"unknown statement {st!r}")
    return False


def run_tidyjax(program: Program) -> Run:
    """Run ``program`` in tidyjax, holding every Tensor it makes until the end (as the JS side
    does), with the garbage collector off so that only tidyjax frees anything; then dispose
    everything and close what it left open."""
    env: dict[str, Any] = {}
    scopes: list[Any] = []
    trace: list[Snapshot] = []
    error = None
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        t0, b0 = _tj_counts()
        for i, st in enumerate(program):
            try:
                rejected = _tj_step(env, scopes, st)
            except Exception as e:
                error = (i, f"{type(e).__name__}: {e}")
                break
            t, b = _tj_counts()
            live = tuple(sorted(n for n, x in env.items() if not x.is_disposed))
            trace.append((t - t0, b - b0, live, rejected))
    finally:
        try:
            for scope in reversed(scopes):
                scope.__exit__(None, None, None)
            tj.dispose_variables()
            tj.dispose(list(env.values()))
            env.clear()
        finally:
            if gc_was_enabled:
                gc.enable()
    assert CURRENT.get() is None, f"a scope is still open: {CURRENT.get()!r}"
    return Run(trace, error)


def first_mismatch(expected: Run, actual: Run) -> int | None:
    """The index of the first statement after which the runs differ (or that raised), or None."""
    for i, (e, a) in enumerate(zip(expected.trace, actual.trace, strict=False)):
        if e != a:
            return i
    if expected.error is not None or actual.error is not None:
        return min(err[0] for err in (expected.error, actual.error) if err is not None)
    if len(expected.trace) != len(actual.trace):
        return min(len(expected.trace), len(actual.trace))
    return None


# -- reporting -------------------------------------------------------------------------------------


def _counts(s: Snapshot | None) -> str:
    if s is None:
        return "-"
    t, b = s[0], s[1]
    return f"{t} tensor{'' if t == 1 else 's'}, {b} buffer{'' if b == 1 else 's'}"


def _at(run: Run, i: int) -> Snapshot | None:
    return run.trace[i] if i < len(run.trace) else None


def _difference(e: Snapshot | None, a: Snapshot | None, actual: Run, i: int) -> str:
    if a is None:
        if actual.error is not None and actual.error[0] == i:
            return f"tidyjax raised {actual.error[1]}"
        return "tidyjax stopped before"
    if e is None:
        return "TF.js stopped before"
    parts = []
    if e[:2] != a[:2]:
        parts.append(f"TF.js: {_counts(e)}, tidyjax: {_counts(a)}")
    only_tfjs, only_tj = sorted(set(e[2]) - set(a[2])), sorted(set(a[2]) - set(e[2]))
    if only_tj:
        parts.append(f"alive only in tidyjax: {', '.join(only_tj)}")
    if only_tfjs:
        parts.append(f"alive only in TF.js: {', '.join(only_tfjs)}")
    if e[3] != a[3]:
        parts.append("TF.js rejected it, tidyjax did not" if e[3] else "tidyjax rejected it")
    return "; ".join(parts)


def _source(tree: Tree) -> str:
    """``tree`` as a Python (and JavaScript) expression over the names."""
    if isinstance(tree, str):
        return tree
    if isinstance(tree, list):
        return f"[{', '.join(_source(item) for item in tree)}]"
    return "{" + ", ".join(f'"{k}": {_source(item)}' for k, item in tree.items()) + "}"


def _py(st: Statement, rejected: bool = False) -> str:
    op = st["op"]
    if op == "create":
        return f"{st['out']} = tj.tensor({[float(v) for v in st['values']]})"
    if op == "unary":
        return f"{st['out']} = {st['x']}.{st['fn']}()"
    if op == "binary":
        return f"{st['out']} = {st['x']}.{st['fn']}({st['y']})"
    if op == "clone":
        return f"{st['out']} = {st['x']}.clone()"
    if op == "try_clone":  # as TF.js went: it rejected it, or not (the x is alive)
        if rejected:
            return f"with pytest.raises(tj.DisposedError): {st['x']}.clone()"
        return f"{st['out']} = {st['x']}.clone()"
    if op == "dispose":
        return f"{st['x']}.dispose()"
    if op == "dispose_tree":
        return f"tj.dispose({_source(st['xs'])})"
    if op == "keep":
        return f"tj.keep({st['x']})"
    if op == "variable":
        return f"{st['out']} = tj.Variable({st['x']})"
    if op == "assign":
        return f"{st['var']}.assign({st['x']})"
    if op == "dispose_variables":
        return "tj.dispose_variables()"
    raise ValueError(op)


def render_python(program: Program, expected: Run, actual: Run | None = None) -> str:
    """``program`` as runnable tidyjax code: after each statement a comment with TF.js's counts
    (and tidyjax's where they differ); after the first difference, an assert of what TF.js
    says, so that the snippet fails where tidyjax departs from TF.js."""
    lines = ["import tidyjax as tj", ""]
    if any(st["op"] == "try_clone" for st in program):
        lines.insert(0, "import pytest")
    open_scopes: list[tuple[str, int]] = []  # (name, number of lines in its block)
    mismatch = None if actual is None else first_mismatch(expected, actual)

    def emit(code: str, i: int) -> None:
        indent = "    " * len(open_scopes)
        e = _at(expected, i)
        note = f"TF.js: {_counts(e)}"
        if actual is not None and _at(actual, i) != e:
            note += f"  <-- {_difference(e, _at(actual, i), actual, i)}"
        lines.append(f"{indent}{code}  # {note}")
        if open_scopes:
            name, n = open_scopes[-1]
            open_scopes[-1] = (name, n + 1)

    for i, st in enumerate(program):
        if mismatch is not None and i > mismatch:
            break
        if st["op"] == "enter":
            name = st["name"]
            emit(f'with tj.tidy("{name}") as {name}:', i)
            open_scopes.append((name, 0))
            continue
        if st["op"] == "exit":
            name, n = open_scopes[-1]
            result = st.get("result")
            indent = "    " * len(open_scopes)
            if result is not None:
                args = _source(result)
                if isinstance(result, list) and all(isinstance(r, str) for r in result):
                    args = ", ".join(result)
                lines.append(f"{indent}{name}.keep({args})  # the scope's result")
            elif n == 0:
                lines.append(f"{indent}pass")
            open_scopes.pop()
            emit(f"# {name} exited", i)
            continue
        e = _at(expected, i)
        emit(_py(st, e is not None and e[3]), i)
    e = None if mismatch is None else _at(expected, mismatch)
    if mismatch is not None and e is not None:  # what TF.js says there, as asserts
        indent = "    " * len(open_scopes)
        lines.append(f"{indent}m = tj.memory()")
        lines.append(
            f"{indent}assert (m.num_tensors, m.num_data_buffers) == {e[:2]!r}, m"
            f"  # TF.js {TFJS_VERSION}"
        )
        names = [  # the names defined: a rejected try_clone defines none
            st["out"]
            for j, st in enumerate(program[: mismatch + 1])
            if "out" in st and not (j < len(expected.trace) and expected.trace[j][3])
        ]
        if names:
            pairs = ", ".join(f"{n!r}: {n}" for n in names)
            alive = [n for n in names if n in e[2]]
            lines.append(
                f"{indent}assert [n for n, t in {{{pairs}}}.items() if not t.is_disposed] == "
                f"{alive!r}"
            )
    return "\n".join(lines)


def render_js(program: Program) -> str:
    """The same program for TF.js: what tests/tfjs/run_program.js runs."""
    lines = ['const tf = require("@tensorflow/tfjs");', "const e = tf.engine();"]
    for st in program:
        op = st["op"]
        if op == "create":
            lines.append(f"var {st['out']} = tf.tensor({json.dumps(st['values'])});")
        elif op == "unary":
            lines.append(f"var {st['out']} = tf.{st['fn']}({st['x']});")
        elif op == "binary":
            lines.append(f"var {st['out']} = tf.{st['fn']}({st['x']}, {st['y']});")
        elif op == "clone":
            lines.append(f"var {st['out']} = {st['x']}.clone();")
        elif op == "try_clone":
            lines.append(f"try {{ var {st['out']} = {st['x']}.clone(); }} catch (err) {{}}")
        elif op == "dispose":
            lines.append(f"{st['x']}.dispose();")
        elif op == "dispose_tree":
            lines.append(f"tf.dispose({_source(st['xs'])});")
        elif op == "keep":
            lines.append(f"tf.keep({st['x']});")
        elif op == "enter":
            lines.append(f'e.startScope("{st["name"]}");  // tf.tidy("{st["name"]}", () => {{')
        elif op == "exit":
            res = "" if st.get("result") is None else _source(st["result"])
            lines.append(f"e.endScope({res});  // return {res or 'nothing'}; }})")
        elif op == "variable":
            lines.append(f"var {st['out']} = tf.variable({st['x']});")
        elif op == "assign":
            lines.append(f"{st['var']}.assign({st['x']});")
        elif op == "dispose_variables":
            lines.append("tf.disposeVariables();")
        lines[-1] += f"  // {len(lines) - 2}"
    return "\n".join(lines)


def shrink(program: Program) -> Program:
    """A smaller program on which tidyjax still departs from TF.js (the model stands in for
    TF.js; ``test_model_is_tfjs`` checks it): cut after the first difference, then greedily
    drop statements (a scope's enter with its exit), make computed tensors plain ``create``s and
    shorten scope results, while the program stays valid and still fails."""

    def cut(candidate: Program) -> Program | None:
        """``candidate`` up to its first difference, or None if it is invalid or agrees."""
        try:
            expected = TfjsModel().run(candidate)
        except InvalidProgramError:
            return None
        i = first_mismatch(expected, run_tidyjax(candidate))
        return None if i is None else candidate[: i + 1]

    current = cut(list(program))
    if current is None:
        return list(program)
    changed = True
    while changed:
        changed = False
        i = len(current) - 1
        while i >= 0:
            for candidate in _simpler(current, i):
                smaller = cut(candidate)
                if smaller is not None:
                    current, changed = smaller, True
                    break
            i = min(i, len(current)) - 1
    return _renamed(current)


def _simpler(program: Program, i: int) -> list[Program]:
    """Programs one step simpler than ``program`` at statement ``i``."""
    st = program[i]
    drop = {i}
    if st["op"] == "enter":  # with its exit
        depth = 0
        for j in range(i + 1, len(program)):
            op = program[j]["op"]
            if op == "enter":
                depth += 1
            elif op == "exit":
                if depth == 0:
                    drop.add(j)
                    break
                depth -= 1
    out = [[s for j, s in enumerate(program) if j not in drop]]

    def replaced(new: Statement) -> Program:
        return [*program[:i], new, *program[i + 1 :]]

    if st["op"] in ("unary", "binary", "clone", "variable") and st["out"][0] == "t":
        out.append(replaced({"op": "create", "out": st["out"], "values": [1.0, 2.0]}))
    if st["op"] == "exit" and st.get("result") is not None:
        out.append(replaced({"op": "exit", "result": None}))
        if not isinstance(st["result"], str):
            names = list(dict.fromkeys(_result_names(st)))
            out += [replaced({"op": "exit", "result": n}) for n in names]
            out += [replaced({"op": "exit", "result": r}) for r in _smaller_trees(st["result"])]
    if st["op"] == "dispose_tree":
        names = list(dict.fromkeys(_leaves(st["xs"])))
        out += [replaced({"op": "dispose", "x": n}) for n in names]
        out += [replaced({"op": "dispose_tree", "xs": r}) for r in _smaller_trees(st["xs"])]
    return out


def _smaller_trees(tree: Tree) -> list[Tree]:
    """``tree`` less one item of one of its lists or dicts (never emptied), or with one of
    them flattened to its first name."""
    if isinstance(tree, str):
        return []
    items = list(tree) if isinstance(tree, list) else list(tree.items())

    def rebuilt(new: list[Any]) -> Tree:
        return new if isinstance(tree, list) else dict(new)

    out: list[Tree] = []
    if len(items) > 1:
        out += [rebuilt(items[:k] + items[k + 1 :]) for k in range(len(items))]
    for k, item in enumerate(items):
        sub = item if isinstance(tree, list) else item[1]
        if isinstance(sub, str):
            continue
        for smaller in [*_smaller_trees(sub), next(_leaves(sub))]:
            new = smaller if isinstance(tree, list) else (item[0], smaller)
            out.append(rebuilt([*items[:k], new, *items[k + 1 :]]))
    return out


def _renamed(program: Program) -> Program:
    """Names numbered in order of definition (t0, t1, v2, ...) and scopes s1, s2, ..."""
    names: dict[str, str] = {}
    scopes = itertools.count(1)
    out = []
    for st in program:
        st = dict(st)
        if "out" in st:
            names[st["out"]] = f"{st['out'][0]}{len(names)}"
        for key in ("x", "y", "var", "out"):
            if key in st:
                st[key] = names[st[key]]
        if st["op"] == "enter":
            st["name"] = f"s{next(scopes)}"
        if st["op"] == "exit":
            st["result"] = _renamed_tree(st.get("result"), names)
        if st["op"] == "dispose_tree":
            st["xs"] = _renamed_tree(st["xs"], names)
        out.append(st)
    return out


def _renamed_tree(tree: Tree, names: dict[str, str]) -> Tree:
    if tree is None or isinstance(tree, str):
        return None if tree is None else names[tree]
    if isinstance(tree, list):
        return [_renamed_tree(item, names) for item in tree]
    return {k: _renamed_tree(item, names) for k, item in tree.items()}


def describe_failure(index: int, program: Program, expected: Run, actual: Run) -> str:
    i = first_mismatch(expected, actual)
    assert i is not None
    st = json.dumps(program[i]) if i < len(program) else "(end)"
    rows = []
    for j, s in enumerate(program):
        e, a = _at(expected, j), _at(actual, j)
        row = f"{j:3d}  {json.dumps(s):<60}  TF.js: {_counts(e):<20}  tidyjax: {_counts(a)}"
        if e is not None and a is not None and e[2] != a[2]:
            only_tj, only_tfjs = sorted(set(a[2]) - set(e[2])), sorted(set(e[2]) - set(a[2]))
            row += f"  (alive only in tidyjax: {only_tj}, only in TF.js: {only_tfjs})"
        rows.append(row)
    return (
        f"program {index} (generate({SEED_BASE + index})) departs from TF.js {TFJS_VERSION} "
        f"after statement {i} of "
        f"{len(program)}: {st}\n  {_difference(_at(expected, i), _at(actual, i), actual, i)}\n"
        f"TF.js error: {expected.error}; tidyjax error: {actual.error}\n\n"
        f"The program up to there, in tidyjax (TF.js's counts after each line):\n\n"
        f"{render_python(program, expected, actual)}\n\n"
        f"Both traces (counts after each statement):\n" + "\n".join(rows)
    )


# -- the tests -------------------------------------------------------------------------------------


# Each kind of statement the programs must hold, at least LEAST_OF_EACH times in all.
REQUIRED_KINDS = (
    "create", "unary", "binary", "clone", "variable", "assign", "dispose_variables",
    "dispose a Variable", "dispose again", "dispose a disposed Variable",
    "dispose a returned tensor", "keep a disposed tensor", "keep an outer tensor in a scope",
    "clone of a disposed tensor, rejected", "assign a Variable its own buffer",
    "exit of nested lists and dicts", "exit of a disposed tensor", "exit of a Variable",
    "exit of a tensor twice", "exit with an outer tensor",
    "dispose_tree of nested lists and dicts", "dispose_tree of a disposed tensor",
    "dispose_tree of a Variable", "dispose_tree of a tensor twice",
)  # fmt: skip
LEAST_OF_EACH = 20
_TIDYJAX_RUNS: dict[int, Run] = {}  # program index -> its run, made once for both tests


def _tidyjax_run(index: int) -> Run:
    if index not in _TIDYJAX_RUNS:
        _TIDYJAX_RUNS[index] = run_tidyjax(PROGRAMS[index])
    return _TIDYJAX_RUNS[index]


@pytest.fixture(scope="module")
def tfjs_runs() -> list[Run]:
    _require_tfjs()
    return run_tfjs(PROGRAMS)


def test_programs_cover_every_statement() -> None:
    """The generator emits every kind of statement often (no TF.js needed): a change that
    stops it from drawing one fails here rather than passing on fewer cases."""
    kinds: Counter[str] = Counter()
    for program in PROGRAMS:
        kinds += statement_kinds(program)
    rare = {k: kinds[k] for k in REQUIRED_KINDS if kinds[k] < LEAST_OF_EACH}
    assert not rare, f"statement kinds drawn too rarely in {NUM_PROGRAMS} programs: {rare}"


def test_model_is_tfjs(tfjs_runs: list[Run]) -> None:
    """The generator's model of TF.js is TF.js: same counts, live tensors and rejections after
    every statement of every program, and no error in TF.js (a rejected ``try_clone`` is
    recorded, not an error)."""
    for i, (program, tfjs) in enumerate(zip(PROGRAMS, tfjs_runs, strict=True)):
        assert tfjs.error is None, f"TF.js rejected program {i}: {tfjs.error}\n{program}"
        model = TfjsModel().run(program)
        bad = first_mismatch(tfjs, model)
        assert bad is None, (
            f"the model departs from TF.js on program {i} at statement {bad}: "
            f"{program[bad]}\nTF.js: {_at(tfjs, bad)}\nmodel: {_at(model, bad)}\n\n"
            f"{render_js(program)}"
        )


@pytest.mark.parametrize("index", range(NUM_PROGRAMS), ids=lambda i: f"program{i}")
def test_program_matches_tfjs(tfjs_runs: list[Run], index: int) -> None:
    """tidyjax's numTensors, numDataBuffers, live tensors and rejections equal TF.js's after
    every statement."""
    program, expected = PROGRAMS[index], tfjs_runs[index]
    actual = _tidyjax_run(index)
    if first_mismatch(expected, actual) is not None:
        pytest.fail(describe_failure(index, program, expected, actual), pytrace=False)


def test_all_programs_agree(tfjs_runs: list[Run]) -> None:
    """How many programs agree fully; the first that does not, shrunk and confirmed in TF.js."""
    failing = [
        i
        for i, expected in enumerate(tfjs_runs)
        if first_mismatch(expected, _tidyjax_run(i)) is not None
    ]
    agree = NUM_PROGRAMS - len(failing)
    summary = f"{agree} of {NUM_PROGRAMS} programs agree with TF.js {TFJS_VERSION} after every "
    summary += f"statement ({sum(map(len, PROGRAMS))} statements in all)"
    print(summary)
    report = ""
    if failing:
        small = shrink(PROGRAMS[failing[0]])
        (expected,) = run_tfjs([small])  # confirmed by TF.js itself, not only by the model
        actual = run_tidyjax(small)
        report = (
            f"\nfailing programs: {failing}\n\nprogram {failing[0]}, shrunk to "
            f"{len(small)} statements; in tidyjax, with TF.js's counts after each line:\n\n"
            f"{render_python(small, expected, actual)}\n\nthe same in TF.js:\n\n"
            f"{render_js(small)}\n\nas JSON (echo '[PROGRAM]' | node {RUNNER.name}):\n"
            f"{json.dumps(small)}"
        )
    assert not failing, summary + report
