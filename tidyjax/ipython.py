"""IPython / Jupyter integration: ``%load_ext tidyjax``.

* ``%%tidy [name] [-q]``: run the cell in a scope. When it ends, every Tensor the cell created
  that something still refers to (a name, a list, a dict, an object, a closure) survives; all
  the rest is disposed, even if IPython's output history (``Out``, ``_``, ``_N``) or a traceback
  refers to it. Prints one line: ``tidy: freed N tensors (X KiB); kept M``.
* ``%tidyjax auto on|off``: the same for every cell. Also, when a cell rebinds or deletes a name,
  the Tensors of the old value are disposed if nothing but the output history holds them.
* ``%tidyjax memory``: the ``memory()`` table. ``%tidyjax live``: live Tensors by creation site.

IPython is imported only when the extension loads; the rich displays (``_repr_html_``) live on
the tidyjax objects themselves and work without it.
"""

from __future__ import annotations

import contextlib
import gc
import re
import types
from typing import Any

from ._inspect import holders, snapshot
from ._memory import _fmt_bytes, memory
from ._scope import Scope
from ._tensor import Tensor
from ._trees import tensors_in

__all__ = ["load_ipython_extension", "unload_ipython_extension"]

_HISTORY = re.compile(r"^(_+|_\d+|_i+|_i\d+|_ih|_oh|_dh|In|Out|exit|quit|get_ipython)$")


def _held_elsewhere(candidates: list[Tensor], shell: Any, ignore: list[Any]) -> set[int]:
    """Ids of the candidates that something other than IPython's history or a frame refers to.

    IPython's own references do not count: the output history (``Out``, and ``_``/``_N`` in the
    user and hidden namespaces), the last execution result, the display hook, traceback frames.
    """
    if not candidates:
        return set()
    from IPython.core.displayhook import DisplayHook
    from IPython.core.interactiveshell import ExecutionResult

    wanted = {id(t): t for t in candidates}
    skip = {id(shell.user_ns.get("Out")), id(ignore), id(wanted), *(id(x) for x in ignore)}
    held: set[int] = set()
    gc.collect()
    for ref in gc.get_referrers(*candidates):
        if (
            id(ref) in skip
            or ref is candidates
            or isinstance(ref, (types.FrameType, ExecutionResult, DisplayHook))
        ):
            continue
        if isinstance(ref, dict):  # a namespace, an object's __dict__, a user dict
            for key, value in ref.items():
                if id(value) in wanted and not (isinstance(key, str) and _HISTORY.match(key)):
                    held.add(id(value))
        elif isinstance(ref, (list, tuple, set, frozenset)):
            held.update(id(v) for v in ref if id(v) in wanted)
        elif isinstance(ref, types.CellType):
            with contextlib.suppress(ValueError):  # an empty cell
                if id(ref.cell_contents) in wanted:
                    held.add(id(ref.cell_contents))
        else:  # an object referring to a candidate some other way: keep what it holds
            held.update(id(t) for t in candidates if _refers(ref, t))
    return held


def _refers(obj: Any, t: Tensor) -> bool:
    return any(r is t for r in gc.get_referents(obj))


class _CellScope:
    """A scope around one cell, closed by deciding what the cell's user still holds."""

    def __init__(self, shell: Any, name: str | None) -> None:
        self.shell = shell
        self.scope = Scope(name or "cell")
        self.scope._open()

    def close(self) -> Scope:
        scope = self.scope
        candidates = _created_in(scope)
        held = _held_elsewhere(candidates, self.shell, ignore=[])
        scope.keep(*[c for c in candidates if id(c) in held])
        del candidates
        scope._close(None)
        return scope


def _created_in(scope: Scope) -> list[Tensor]:
    """The live Tensors on buffers ``scope`` owns."""
    recs = [r for r in scope._owned if r.scope is scope and r.dead is None]
    return [t for _, ts in holders(recs) for t in ts]


def _summary(scope: Scope) -> str:
    return (
        f"tidy: freed {scope.num_freed} buffer{'' if scope.num_freed == 1 else 's'} "
        f"({_fmt_bytes(scope.bytes_freed)}); "
        f"kept {scope.num_handed_out}"
    )


class _Auto:
    """``%tidyjax auto on``: a scope around every cell, and freeing of rebound old values."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self.cell: _CellScope | None = None
        self.before: dict[str, Any] = {}

    def pre_run_cell(self, info: Any = None) -> None:
        ns = self.shell.user_ns
        # Remember the values that hold Tensors, to free the old ones a cell rebinds.
        self.before = {
            name: value
            for name, value in ns.items()
            if not _HISTORY.match(name) and not name.startswith("_") and tensors_in_safe(value)
        }
        self.cell = _CellScope(self.shell, "cell")

    def post_run_cell(self, result: Any = None) -> None:
        cell, self.cell = self.cell, None
        if cell is not None:
            try:
                cell.close()
            except Exception:  # the cell left a scope open: free in order, never crash IPython
                _close_all(cell.scope)
        ns = self.shell.user_ns
        # Old values: no longer bound to their name, nor to any other current user name.
        bound = {id(v) for name, v in ns.items() if not _HISTORY.match(name)}
        old = [
            v
            for name, v in self.before.items()
            if ns.get(name, _MISSING) is not v and id(v) not in bound
        ]
        self.before = {}
        candidates = [t for t in tensors_in_safe(old) if not t.is_disposed]
        if not candidates:
            return
        held = _held_elsewhere(candidates, self.shell, ignore=[old, *old])
        for t in candidates:
            if id(t) not in held and not _held_by_live_values(t, ns):
                t.dispose()


_MISSING = object()


def tensors_in_safe(value: Any) -> list[Tensor]:
    """The Tensors in a user value, or none if it is not a walkable pytree."""
    if isinstance(value, (types.ModuleType, type, types.FunctionType)):
        return []
    try:
        return tensors_in(value)
    except Exception:
        return []


def _held_by_live_values(t: Tensor, ns: dict[str, Any]) -> bool:
    """Whether ``t`` is inside a value a current user name binds."""
    for name, value in ns.items():
        if not _HISTORY.match(name) and any(x is t for x in tensors_in_safe(value)):
            return True
    return False


def _close_all(scope: Scope) -> None:
    from ._context import CURRENT

    while isinstance(current := CURRENT.get(), Scope):
        current._close(None)
        if current is scope:
            return


def _make_magics(shell: Any) -> Any:
    from IPython.core.magic import Magics, cell_magic, line_magic, magics_class

    @magics_class
    class TidyjaxMagics(Magics):
        def __init__(self, shell: Any) -> None:
            super().__init__(shell)
            self.auto: _Auto | None = None

        @cell_magic
        def tidy(self, line: str, cell: str) -> None:
            """%%tidy [name] [-q]: run the cell in a scope; keep what the cell's names hold."""
            args = line.split()
            quiet = "-q" in args
            names = [a for a in args if a != "-q"]
            if len(names) > 1 or any(a.startswith("-") for a in names):
                from IPython.core.error import UsageError

                raise UsageError(f"usage: %%tidy [name] [-q]; got {line!r}")
            scoped = _CellScope(self.shell, names[0] if names else None)
            try:
                assert self.shell is not None  # set when the extension loads
                result = self.shell.run_cell(cell, store_history=False)
            finally:
                scope = scoped.close()
            if not quiet:
                print(_summary(scope))
            error = result.error_before_exec or result.error_in_exec
            if error is not None:  # fail this cell too, so "run all" stops here
                from IPython.core.error import UsageError

                raise UsageError(f"the %%tidy cell raised {type(error).__name__}: {error}")

        @line_magic
        def tidyjax(self, line: str) -> Any:
            """%tidyjax auto on|off | memory | live"""
            args = line.split()
            if args == ["memory"]:
                return memory()
            if args == ["live"]:
                return snapshot()
            if len(args) == 2 and args[0] == "auto" and args[1] in ("on", "off"):
                self.set_auto(args[1] == "on")
                print(f"tidyjax auto mode {args[1]}")
                return None
            from IPython.core.error import UsageError

            raise UsageError("usage: %tidyjax auto on|off | %tidyjax memory | %tidyjax live")

        def set_auto(self, on: bool) -> None:
            assert self.shell is not None  # set when the extension loads
            events = self.shell.events
            if on and self.auto is None:
                self.auto = _Auto(self.shell)
                events.register("pre_run_cell", self.auto.pre_run_cell)
                events.register("post_run_cell", self.auto.post_run_cell)
            elif not on and self.auto is not None:
                events.unregister("pre_run_cell", self.auto.pre_run_cell)
                events.unregister("post_run_cell", self.auto.post_run_cell)
                self.auto.post_run_cell()  # close the scope of the cell running this magic
                self.auto = None

    return TidyjaxMagics(shell)


_loaded: dict[int, Any] = {}


def load_ipython_extension(ip: Any) -> None:
    """Register the ``%%tidy`` and ``%tidyjax`` magics (``%load_ext tidyjax``)."""
    if id(ip) in _loaded:
        return
    magics = _make_magics(ip)
    ip.register_magics(magics)
    _loaded[id(ip)] = magics


def unload_ipython_extension(ip: Any) -> None:
    """Turn auto mode off (``%unload_ext tidyjax``)."""
    magics = _loaded.pop(id(ip), None)
    if magics is not None:
        magics.set_auto(False)
