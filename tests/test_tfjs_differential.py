"""Differential test: tidyjax's tidy/keep/dispose/clone/Variable books against TensorFlow.js 4.22.

Random programs of the statements both libraries have (create, elementwise ops, clone, dispose,
keep, tidy scopes exited with a result, Variables, assign, dispose_variables) run in TF.js itself
(``tests/tfjs/run_program.js``: Node, ``@tensorflow/tfjs`` 4.22.0, the pure-JS CPU backend, one
process for all programs) and in tidyjax. After *every* statement the two must agree on
``numTensors``, ``numDataBuffers`` and which of the program's tensors are still alive. Passing
proves that, on these programs, tidyjax frees exactly what TF.js frees, when TF.js frees it.

A TF.js scope is the engine's own ``startScope(name)`` / ``endScope(result)``, exactly what
``tf.tidy`` runs around its function; a tidyjax scope is ``tj.tidy(name)`` entered and, at exit,
``scope.keep(*result)`` (a scope's keep hands values out exactly as returning them would) before
``__exit__``. TF.js has no per-scope keep, so no program hands a value out early.

The generator knows which names are alive from :class:`TfjsModel`, a transcription of TF.js's
``engine.js`` for these statements (``startScope``, ``endScope``, ``track``, ``keep``,
``disposeTensor``, ``makeVariable``, ``Variable.assign``, ``disposeVariables``), so programs never
touch a disposed tensor. ``test_model_is_tfjs`` checks that model against real TF.js, statement
by statement. On a mismatch, ``test_all_programs_agree`` shrinks the first failing program and
prints it as runnable Python with TF.js's counts after each line.

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
from collections.abc import Callable, Sequence
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
NUM_PROGRAMS = 40
STATEMENTS = 30
MAX_DEPTH = 3

Statement = dict[str, Any]
Program = list[Statement]
Snapshot = tuple[int, int, tuple[str, ...]]  # numTensors, numDataBuffers, live names (sorted)


@dataclass
class Run:
    """What one library did with one program: a snapshot after each statement that ran, and the
    error that stopped it, as (statement index, message)."""

    trace: list[Snapshot]
    error: tuple[int, str] | None = None


class InvalidProgramError(Exception):
    """A statement TF.js would reject (or mishandle): the generator never emits one."""


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
    the statements the programs use. Raises :class:`InvalidProgramError` where TF.js would throw or
    where its books would go wrong (disposing a Variable twice decrements twice)."""

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

    def snapshot(self) -> Snapshot:
        return self.num_tensors, len(self.info), tuple(sorted(self.live()))

    # engine.js

    def _track(self, t: _T) -> None:
        if self.stack:
            t.scope = self.stack[-1][0]
            self.stack[-1][1].append(t)

    def _track_tensor(self, t: _T) -> None:
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

    def _dispose_tensor(self, t: _T) -> None:  # engine.disposeTensor + backend.disposeData
        if t.data not in self.info:
            return
        self.num_tensors -= 1
        self.refs[t.data] -= 1
        if self.refs[t.data] == 0:
            del self.refs[t.data]
            self.info.discard(t.data)

    def _dispose(self, t: _T) -> None:  # Tensor.dispose / Variable.dispose
        if t.variable:
            if t.disposed or not t.registered:
                raise InvalidProgramError(
                    "TF.js decrements a Variable's count again on each dispose"
                )
            self._dispose_tensor(t)
            t.registered = False
        elif t.disposed:
            return
        else:
            self._dispose_tensor(t)
        t.disposed = True

    def _get(self, name: str) -> _T:
        if name not in self.env:
            raise InvalidProgramError(f"{name} is not defined")
        if not self.alive(name):
            raise InvalidProgramError(f"{name} is disposed")
        return self.env[name]

    def _define(self, name: str, t: _T) -> None:
        if name in self.env:
            raise InvalidProgramError(f"{name} is defined twice")
        self.env[name] = t

    def step(self, st: Statement) -> None:
        op = st["op"]
        if op == "create":
            self._define(st["out"], self._new())
        elif op in ("unary", "binary"):
            for name in (st["x"], st["y"]) if op == "binary" else (st["x"],):
                self._get(name)
            self._define(st["out"], self._new())
        elif op == "clone":  # the Identity kernel: backend.incRef, then a Tensor on the same data
            x = self._get(st["x"])
            self.refs[x.data] += 1
            t = _T(x.data)
            self._track_tensor(t)
            self._define(st["out"], t)
        elif op == "dispose":
            if st["x"] not in self.env:
                raise InvalidProgramError(f"{st['x']} is not defined")
            self._dispose(self.env[st["x"]])
        elif op == "keep":
            self._get(st["x"]).kept = True
        elif op == "enter":
            self.stack.append((next(self._ids), []))
        elif op == "exit":
            if not self.stack:
                raise InvalidProgramError("exit without an open scope")
            result = [self._get(n) for n in _result_names(st)]
            scope_id, tracked = self.stack[-1]
            for t in tracked:
                if not t.kept and not any(t is r for r in result):
                    self._dispose(t)
            self.stack.pop()
            seen: list[_T] = []
            for t in result:  # getTensorsInContainer: each tensor once
                if any(t is s for s in seen):
                    continue
                seen.append(t)
                if not t.kept and t.scope == scope_id:
                    self._track(t)
        elif op == "variable":  # makeVariable: shares the data; incRef; never tracked by a scope
            x = self._get(st["x"])
            v = _T(x.data, variable=True)
            self._track_tensor(v)
            self.refs[x.data] += 1
            self._define(st["out"], v)
        elif op == "assign":
            v, x = self._get(st["var"]), self._get(st["x"])
            if not v.variable:
                raise InvalidProgramError(f"{st['var']} is not a Variable")
            if v is x:
                raise InvalidProgramError("v.assign(v) frees v's data before TF.js re-counts it")
            self._dispose_tensor(v)
            v.data = x.data
            self._track_tensor(v)
            self.refs[x.data] += 1
        elif op == "dispose_variables":  # disposeTensor and unregister; isDisposed stays false
            for t in self.env.values():
                if t.variable and t.registered:
                    self._dispose_tensor(t)
                    t.registered = False
        else:
            raise InvalidProgramError(f"unknown statement {st!r}")

    def run(self, program: Program) -> Run:
        trace = []
        for st in program:
            self.step(st)
            trace.append(self.snapshot())
        return Run(trace)


def _result_names(st: Statement) -> list[str]:
    result = st.get("result")
    if result is None:
        return []
    return [result] if isinstance(result, str) else list(result)


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
        self.model.step(st)
        self.program.append(st)
        if "out" in st:
            self.made[-1].append(st["out"])
        elif st["op"] == "enter":
            self.made.append([])
        elif st["op"] == "exit":
            inner = self.made.pop()
            self.made[-1] += [n for n in _result_names(st) if n in inner]

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

    def dispose(self) -> Statement:
        return {"op": "dispose", "x": self.pick()}

    def dispose_again(self) -> Statement:  # disposing twice is a no-op (not for a Variable)
        env = self.model.env
        dead = [n for n, t in env.items() if t.disposed and not t.variable]
        return {"op": "dispose", "x": self.rng.choice(dead)}

    def keep(self) -> Statement:
        return {"op": "keep", "x": self.pick()}

    def enter(self) -> Statement:
        return {"op": "enter", "name": f"s{next(self.scopes)}"}

    def exit(self) -> Statement:
        """Exit the innermost scope with nothing, one name or a list of names as its result."""
        rng, live = self.rng, self.model.live()
        local = [n for n in self.made[-1] if n in live]
        r = rng.random()
        result: Any = None
        if live and r < 0.4:
            result = rng.choice(local) if local and rng.random() < 0.8 else rng.choice(live)
        elif live and r < 0.75:
            pool = local if len(local) >= 2 and rng.random() < 0.7 else live
            result = rng.sample(pool, min(len(pool), rng.randint(2, 3)))
        return {"op": "exit", "result": result}

    def variable(self) -> Statement:
        return {"op": "variable", "x": self.pick(), "out": self.fresh("v")}

    def assign(self) -> Statement:
        var = self.rng.choice(self._variables())
        x = self.pick([n for n in self.model.live() if n != var])
        return {"op": "assign", "var": var, "x": x}

    def dispose_variables(self) -> Statement:
        return {"op": "dispose_variables"}

    def _variables(self) -> list[str]:
        return [n for n in self.model.live() if self.model.env[n].variable]

    def options(self) -> list[tuple[float, Callable[[], Statement]]]:
        """The statement kinds valid now, with their weights."""
        model = self.model
        live = model.live()
        out: list[tuple[float, Callable[[], Statement]]] = [(3.0, self.create)]
        if live:
            out += [(1.5, self.unary), (1.5, self.binary), (2.5, self.clone)]
            out += [(2.0, self.dispose), (1.5, self.keep), (0.8, self.variable)]
        if any(t.disposed and not t.variable for t in model.env.values()):
            out.append((0.3, self.dispose_again))
        if model.depth < MAX_DEPTH:
            out.append((2.0, self.enter))
        if model.depth:
            out.append((1.8, self.exit))
        if self._variables():
            out.append((0.25, self.dispose_variables))
            if len(live) >= 2:
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
        trace = [(t, b, tuple(live)) for t, b, live in r["trace"]]
        err = r["error"]
        runs.append(Run(trace, None if err is None else (err["index"], err["message"])))
    return runs


def _tj_counts() -> tuple[int, int]:
    m = tj.memory(scan_untracked=False)
    return m.num_tensors, m.num_data_buffers


def _tj_step(env: dict[str, Any], scopes: list[Any], st: Statement) -> None:
    op = st["op"]
    if op == "create":
        env[st["out"]] = tj.tensor([float(v) for v in st["values"]])
    elif op == "unary":
        env[st["out"]] = getattr(env[st["x"]], st["fn"])()
    elif op == "binary":
        env[st["out"]] = getattr(env[st["x"]], st["fn"])(env[st["y"]])
    elif op == "clone":
        env[st["out"]] = env[st["x"]].clone()
    elif op == "dispose":
        env[st["x"]].dispose()
    elif op == "keep":
        tj.keep(env[st["x"]])
    elif op == "enter":
        scope = tj.tidy(st["name"])
        scope.__enter__()
        scopes.append(scope)
    elif op == "exit":
        scope = scopes.pop()
        result = [env[n] for n in _result_names(st)]
        if result:
            scope.keep(*result)
        scope.__exit__(None, None, None)
    elif op == "variable":
        env[st["out"]] = tj.Variable(env[st["x"]])
    elif op == "assign":
        env[st["var"]].assign(env[st["x"]])
    elif op == "dispose_variables":
        tj.dispose_variables()
    else:
        raise ValueError(f"unknown statement {st!r}")


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
                _tj_step(env, scopes, st)
            except Exception as e:
                error = (i, f"{type(e).__name__}: {e}")
                break
            t, b = _tj_counts()
            live = tuple(sorted(n for n, x in env.items() if not x.is_disposed))
            trace.append((t - t0, b - b0, live))
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
    return "; ".join(parts)


def _py(st: Statement) -> str:
    op = st["op"]
    if op == "create":
        return f"{st['out']} = tj.tensor({[float(v) for v in st['values']]})"
    if op == "unary":
        return f"{st['out']} = {st['x']}.{st['fn']}()"
    if op == "binary":
        return f"{st['out']} = {st['x']}.{st['fn']}({st['y']})"
    if op == "clone":
        return f"{st['out']} = {st['x']}.clone()"
    if op == "dispose":
        return f"{st['x']}.dispose()"
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
            result = _result_names(st)
            indent = "    " * len(open_scopes)
            if result:
                lines.append(f"{indent}{name}.keep({', '.join(result)})  # the scope's result")
            elif n == 0:
                lines.append(f"{indent}pass")
            open_scopes.pop()
            emit(f"# {name} exited", i)
            continue
        emit(_py(st), i)
    e = None if mismatch is None else _at(expected, mismatch)
    if mismatch is not None and e is not None:  # what TF.js says there, as asserts
        indent = "    " * len(open_scopes)
        lines.append(f"{indent}m = tj.memory()")
        lines.append(
            f"{indent}assert (m.num_tensors, m.num_data_buffers) == {e[:2]!r}, m"
            f"  # TF.js {TFJS_VERSION}"
        )
        names = [st["out"] for st in program[: mismatch + 1] if "out" in st]
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
        elif op == "dispose":
            lines.append(f"{st['x']}.dispose();")
        elif op == "keep":
            lines.append(f"tf.keep({st['x']});")
        elif op == "enter":
            lines.append(f'e.startScope("{st["name"]}");  // tf.tidy("{st["name"]}", () => {{')
        elif op == "exit":
            names = _result_names(st)
            res = "" if st.get("result") is None else names[0]
            if isinstance(st.get("result"), list):
                res = f"[{', '.join(names)}]"
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
        names = _result_names(st)
        if isinstance(st["result"], str):
            out.append(replaced({"op": "exit", "result": None}))
        else:
            out += [replaced({"op": "exit", "result": n}) for n in names]
            if len(names) > 2:
                out += [
                    replaced({"op": "exit", "result": [m for m in names if m != n]}) for n in names
                ]
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
        if st["op"] == "exit" and st.get("result") is not None:
            r = st["result"]
            st["result"] = names[r] if isinstance(r, str) else [names[n] for n in r]
        out.append(st)
    return out


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


@pytest.fixture(scope="module")
def tfjs_runs() -> list[Run]:
    _require_tfjs()
    return run_tfjs(PROGRAMS)


def test_model_is_tfjs(tfjs_runs: list[Run]) -> None:
    """The generator's model of TF.js is TF.js: same counts and live tensors after every
    statement of every program, and no statement TF.js rejects."""
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
    """tidyjax's numTensors, numDataBuffers and live tensors equal TF.js's after every
    statement."""
    program, expected = PROGRAMS[index], tfjs_runs[index]
    actual = run_tidyjax(program)
    if first_mismatch(expected, actual) is not None:
        pytest.fail(describe_failure(index, program, expected, actual), pytrace=False)


def test_all_programs_agree(tfjs_runs: list[Run]) -> None:
    """How many programs agree fully; the first that does not, shrunk and confirmed in TF.js."""
    failing = [
        i
        for i, (program, expected) in enumerate(zip(PROGRAMS, tfjs_runs, strict=True))
        if first_mismatch(expected, run_tidyjax(program)) is not None
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
