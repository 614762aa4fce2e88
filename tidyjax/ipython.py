"""IPython / Jupyter integration: ``%load_ext tidyjax``.

* ``%%tidy [name] [-q]``: run the cell in a scope. When it ends, every Tensor and raw
  ``jax.Array`` that only IPython's history holds *of what ``%%tidy`` cells showed* is freed: the
  cell's own ``Out[n]``, ``_``/``__``/``___``/``_N`` entries, result and traceback, and the
  ``Out`` entries of earlier ``%%tidy`` (and auto-mode) cells, directly or through the containers
  and objects they show. That covers what the cell made and only showed, and what an earlier
  ``%%tidy`` cell showed whose last name this cell rebound or deleted. What an ordinary cell
  showed is never freed by ``%%tidy`` (so is anything such an output also reaches): its history
  entries count as holders. What a user-visible name reaches through any container or object (a
  list, a dict, a NumPy object array, an attribute, a closure) is kept, and so is what anything
  else outside the history holds (a module, a cache, a jitted function). A freed output's
  ``Out[n]`` and ``_`` entries become a placeholder, which raises a ``DisposedError`` naming the
  entry and what freed it when used. The body runs as the cell itself: its Tensors' creation
  sites and tracebacks read ``In[n], line L`` with the cell's own number and line numbers (the
  ``%%tidy`` line is line 1). Prints one line:
  ``tidy: freed N buffers (X KiB); kept M; freed K jax arrays (Y MiB)``.
* ``%tidyjax auto on|off``: the same around every cell, over *all* of the history: what any cell
  showed is freed once only the history holds it.
* ``%tidyjax free``: that once, now (what any cell showed, as auto mode does).
* ``%tidyjax memory``: the ``memory()`` table. ``%tidyjax live``: live Tensors by creation site.
* ``%tidyjax timeline on|off|show``: record a timeline of the cells run while on, one band per
  cell; ``show`` (or ``%tidyjax timeline`` alone) displays its chart.

The decision of what only the history holds, the placeholders and the deletion of raw arrays
live in ``_history`` (testable without IPython); this module holds the cell scopes, the hooks
and the magics.

IPython is imported only when the extension loads; the rich displays (``_repr_html_``) live on
the tidyjax objects themselves and work without it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ._arrays import ArrayImpl
from ._census import holders
from ._errors import scope_exited
from ._format import count as _count
from ._format import fmt_bytes as _fmt_bytes
from ._history import Decision, Seen, delete_unshared, freed_reason
from ._memory import memory
from ._scope import Scope, close_scope, close_through, open_scope, owned_records
from ._snapshot import snapshot
from ._tensor import Tensor, dispose_tensor, record

__all__ = ["load_ipython_extension", "unload_ipython_extension"]


# -- a cell ------------------------------------------------------------------------------------


class _CellScope:
    """A scope around one cell; closed by freeing what only IPython's history holds.

    ``mode``: ``"tidy"`` (a ``%%tidy`` cell: only the entries of ``%%tidy`` cells count, its own
    and the ``Out`` keys in ``managed``), ``"auto"`` or ``"free"`` (all of the history).
    ``managed``: the ``Out`` keys that ``%%tidy`` and auto cells showed (key -> id of the
    value), shared by the extension's cells; the cell's own are added at its end.
    """

    def __init__(
        self,
        shell: Any,
        name: str | None,
        inert: dict[Any, int],
        mode: str = "tidy",
        managed: dict[Any, int] | None = None,
    ) -> None:
        self.shell = shell
        self.inert = inert  # see Decision
        self.mode = mode
        self.managed = managed if managed is not None else {}
        self.seen = Seen(shell)  # before the scope: what the history showed already
        self.number = _running_number(shell)  # the cell's In[n], when it is known already
        self.scope = open_scope(name or "cell")
        self.old_freed = 0  # buffers of earlier Tensors freed at the end (the scope counts its own)
        self.old_bytes_freed = 0
        self.arrays_freed = 0
        self.array_bytes_freed = 0

    def who(self, results: Iterable[Any]) -> str:
        """What frees at this cell's end, as its errors name it."""
        n = self.number
        if n is None:  # auto mode's scope opens before IPython hands the cell its number
            n = next((r.execution_count for r in results if r.execution_count is not None), None)
        cell = "" if n is None else f" at the end of In[{n}]"
        if self.mode == "auto":
            return f"auto mode (%tidyjax auto on){cell}"
        if self.mode == "free":
            return "%tidyjax free" + ("" if n is None else f" (In[{n}])")
        return f"%%tidy{cell}"

    def close(self, results: Iterable[Any] = ()) -> Scope:
        """Free what only the history holds (the cell's Tensors, raw arrays, earlier Tensors);
        close the scope. ``results``: the cells' ExecutionResults, which are history too."""
        results = list(results)
        scope = self.scope
        who = self.who(results)
        own_ids, own_keys = self.seen.own(self.shell)
        # The cell's Tensors are held only by ``created`` while the decision counts references.
        created: dict[int, Tensor] = {id(t): t for t in _created_in(scope)}
        decision = Decision(self.shell, created, results, self.inert, self._part(own_ids, own_keys))
        del own_ids
        free = decision.free
        labels = decision.labels(free)
        scope.keep(*[t for k, t in created.items() if k not in free])
        nodes = decision.nodes
        old = [nodes[k] for k in free if k not in created and isinstance(nodes[k], Tensor)]
        arrays = [nodes[k] for k in free if type(nodes[k]) is ArrayImpl]
        # the records of the cell's Tensors its scope frees: they say why at the end
        mine_freed = {
            id(record(t)): (record(t), labels.get(k)) for k, t in created.items() if k in free
        }
        del created
        try:
            close_scope(scope)
        finally:
            self._name_why(mine_freed.values(), scope, who)
            self._free_old(old, labels, who)
            deleted, nbytes = delete_unshared(arrays)
            self.arrays_freed, self.array_bytes_freed = len(deleted), nbytes
            decision.drop_history_of(deleted, who)
            self._remember_shown(own_keys)
        return scope

    def _part(self, own_ids: Any, own_keys: set[Any]) -> Any:
        """``%%tidy``'s part of the history: what this cell showed, and what earlier
        ``%%tidy`` cells showed that ``Out`` still holds; None in auto mode (all of it)."""
        if self.mode != "tidy":
            return None
        out = self.shell.user_ns.get("Out")
        out = out if isinstance(out, dict) else {}
        mine = {n for n, i in self.managed.items() if n in out and id(out[n]) == i}
        return (own_ids, own_keys | mine)

    @staticmethod
    def _name_why(freed: Iterable[tuple[Any, Any]], scope: Scope, who: str) -> None:
        """The cell's Tensors its scope freed say so when used: by whom, held where."""
        exited = scope_exited(scope.path)
        for rec, label in freed:
            if rec is not None and rec.dead == exited:
                rec.dead = freed_reason(who, label)

    def _free_old(self, old: list[Tensor], labels: dict[int, Any], who: str) -> None:
        """Dispose the earlier Tensors only the history holds (the last holder frees)."""
        for t in old:
            rec = record(t)
            if rec is not None and rec.dead is None:
                size = rec.size()
                dispose_tensor(t, freed_reason(who, labels.get(id(t))))
                if rec.dead is not None:
                    self.old_freed += 1
                    self.old_bytes_freed += size

    def _remember_shown(self, own_keys: set[Any]) -> None:
        """What this cell showed is %%tidy's to free from now on; forget what Out dropped."""
        out = self.shell.user_ns.get("Out")
        if isinstance(out, dict):
            self.managed.update((n, id(out[n])) for n in own_keys if n in out)
            for n in [n for n in self.managed if n not in out]:
                del self.managed[n]

    def summary(self) -> str:
        scope = self.scope
        freed = scope.num_freed + self.old_freed
        nbytes = scope.bytes_freed + self.old_bytes_freed
        parts = []
        if freed or scope.num_handed_out or not self.arrays_freed:
            parts.append(
                f"freed {_count(freed, 'buffer')} ({_fmt_bytes(nbytes)}); "
                f"kept {scope.num_handed_out}"
            )
        if self.arrays_freed:
            parts.append(
                f"freed {_count(self.arrays_freed, 'jax array')} "
                f"({_fmt_bytes(self.array_bytes_freed)})"
            )
        return "tidy: " + "; ".join(parts)


def _running_number(shell: Any) -> int | None:
    """The number of the cell running now (its prompt's ``In[n]``), known once IPython runs
    its code (from a magic), not in its ``pre_run_cell`` hook."""
    running = getattr(shell.displayhook, "exec_result", None)
    n = getattr(running, "execution_count", None)
    return n if isinstance(n, int) else None


def _created_in(scope: Scope) -> list[Tensor]:
    """The live Tensors on buffers ``scope`` owns."""
    return [t for _, ts in holders(owned_records(scope)) for t in ts]


class _Hooks:
    """The cell hooks of ``%tidyjax auto on`` and ``%tidyjax timeline on``, registered while
    either is on: a timeline section around each cell, and auto mode's cell scope inside it (so
    the timeline sees the scope open, and the frees at its end)."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self.auto = False
        self.cell: _CellScope | None = None  # auto mode's scope around the running cell
        self.timeline: Any = None  # the Timeline recording while on
        self.last: Any = None  # the Timeline recorded last (the open one while on)
        self.section: Any = None  # the running cell's section of it, entered
        self.registered = False
        self.inert: dict[Any, int] = {}  # Out entries not to walk again (see Decision)
        self.managed: dict[Any, int] = {}  # Out entries %%tidy and auto cells showed (_CellScope)
        self.depth = 0  # cells running: a %%tidy cell runs its body as a cell inside its own
        # IPython counts a numbered cell before its pre_run_cell hook (9.8 and later) or after
        # it: learnt from each numbered cell, to name the next one as its prompt does.
        self.counted_first = _counts_first(shell)
        self.count_at_pre = 0

    def pre_run_cell(self, info: Any = None) -> None:
        self.depth += 1
        if self.depth > 1:
            return
        count = self.count_at_pre = self.shell.execution_count
        if self.timeline is not None:
            numbered = info is None or getattr(info, "store_history", True)
            n = count - 1 if numbered and self.counted_first else count
            self.section = self.timeline.section(f"In[{n}]")
            self.section.__enter__()
        if self.auto:
            self.cell = _CellScope(self.shell, "cell", self.inert, "auto", self.managed)

    def post_run_cell(self, result: Any = None) -> None:
        if self.depth == 0:  # an empty cell, or the one that turned a hook on
            return
        self.depth -= 1
        if self.depth:
            return
        info = getattr(result, "info", None)
        if getattr(info, "store_history", False) and result.execution_count is not None:
            self.counted_first = self.count_at_pre == result.execution_count + 1
        cell, self.cell = self.cell, None
        try:
            if cell is not None:
                _close_cell(cell, [result] if result is not None else [])
        finally:
            self._end_section()

    def _end_section(self) -> None:
        section, self.section = self.section, None
        if section is not None:
            section.__exit__(None, None, None)

    def set_auto(self, on: bool) -> None:
        if not on:
            cell, self.cell = self.cell, None  # the scope of the cell running this magic
            if cell is not None:
                _close_cell(cell, [])
        self.auto = on
        self._register()

    def set_timeline(self, on: bool) -> None:
        if on and self.timeline is None:
            from ._timeline import timeline

            self.timeline = self.last = timeline()
            self.counted_first = _counts_first(self.shell)
        elif not on and self.timeline is not None:
            self._end_section()  # the section of the cell running this magic
            self.timeline = None
        self._register()

    def _register(self) -> None:
        events = self.shell.events
        wanted = self.auto or self.timeline is not None
        if wanted and not self.registered:
            events.register("pre_run_cell", self.pre_run_cell)
            events.register("post_run_cell", self.post_run_cell)
        elif not wanted and self.registered:
            events.unregister("pre_run_cell", self.pre_run_cell)
            events.unregister("post_run_cell", self.post_run_cell)
            self.depth = 0  # the running cell's post_run_cell will not come
        self.registered = wanted


def _counts_first(shell: Any) -> bool:
    """Whether IPython counts a numbered cell before running it (9.8 and later): seen from the
    cell running now, else from IPython's version."""
    running = getattr(shell.displayhook, "exec_result", None)
    number = getattr(running, "execution_count", None)
    if getattr(getattr(running, "info", None), "store_history", False) and number is not None:
        return bool(shell.execution_count == number + 1)
    import IPython

    return tuple(IPython.version_info[:2]) >= (9, 8)


def _close_cell(cell: _CellScope, results: list[Any]) -> None:
    try:
        cell.close(results)
    except Exception:  # the cell left a scope open: free in order, never crash IPython
        close_through(cell.scope)


# -- the magics --------------------------------------------------------------------------------


def _run_body(shell: Any, line: str, body: str, number: int | None) -> Any:
    """Run a ``%%tidy`` cell's body as that cell: compiled under its own number (IPython 9.8
    and later count the cell before it runs, so the body would get the next cell's ``In[n]``)
    and with its own line numbers (a comment stands for the ``%%tidy`` line, unless the body
    starts with another cell magic, which must stay first)."""
    first = next((ln for ln in body.splitlines() if ln.strip()), "")
    if not first.lstrip().startswith("%%"):
        indent = first[: len(first) - len(first.lstrip())]  # IPython dedents by the first line
        body = f"{indent}# %%tidy {line}".rstrip() + "\n" + body
    compiler = shell.compile
    patched = number is not None and "cache" not in vars(compiler)
    if patched:
        cache = compiler.cache

        def cache_as_this_cell(code: str, _number: int = 0, *args: Any, **kwargs: Any) -> Any:
            return cache(code, number, *args, **kwargs)

        compiler.cache = cache_as_this_cell
    try:
        return shell.run_cell(body, store_history=False)
    finally:
        if patched:
            del compiler.cache


def _make_magics(shell: Any) -> Any:
    from IPython.core.magic import Magics, cell_magic, line_magic, magics_class

    @magics_class
    class TidyjaxMagics(Magics):
        def __init__(self, shell: Any) -> None:
            super().__init__(shell)
            self.hooks = _Hooks(shell)

        @cell_magic
        def tidy(self, line: str, cell: str) -> None:
            """%%tidy [name] [-q]: run the cell in a scope; at its end, free every Tensor and
            jax array that only IPython's history holds of what %%tidy cells showed."""
            _tidy_cell(self.shell, self.hooks, line, cell)

        @line_magic
        def tidyjax(self, line: str) -> Any:
            """%tidyjax auto on|off | free | memory | live | timeline [on|off|show]"""
            return _tidyjax_line(self.shell, self.hooks, line)

    return TidyjaxMagics(shell)


def _usage_error(text: str) -> Exception:
    from IPython.core.error import UsageError

    return UsageError(text)


def _tidy_cell(shell: Any, hooks: _Hooks, line: str, cell: str) -> None:
    """``%%tidy [name] [-q]``: the cell's body in a cell scope, then its summary."""
    args = line.split()
    quiet = "-q" in args
    names = [a for a in args if a != "-q"]
    if len(names) > 1 or any(a.startswith("-") for a in names):
        raise _usage_error(f"usage: %%tidy [name] [-q]; got {line!r}")
    scoped = _CellScope(shell, names[0] if names else None, hooks.inert, "tidy", hooks.managed)
    result = None
    try:
        result = _run_body(shell, line, cell, scoped.number)
    finally:
        scoped.close([result] if result is not None else [])
    if not quiet:
        print(scoped.summary())
    error = result.error_before_exec or result.error_in_exec
    if error is not None:  # fail this cell too, so "run all" stops here
        raise _usage_error(f"the %%tidy cell raised {type(error).__name__}: {error}")


_TIMELINE_ARGS = (["timeline"], ["timeline", "on"], ["timeline", "off"], ["timeline", "show"])


def _tidyjax_line(shell: Any, hooks: _Hooks, line: str) -> Any:
    """``%tidyjax auto on|off | free | memory | live | timeline [on|off|show]``."""
    args = line.split()
    if args == ["memory"]:
        return memory()
    if args == ["live"]:
        return snapshot()
    if args == ["free"]:
        scoped = _CellScope(shell, "free", hooks.inert, "free", hooks.managed)
        _close_cell(scoped, [])
        print(scoped.summary())
        return None
    if len(args) == 2 and args[0] == "auto" and args[1] in ("on", "off"):
        hooks.set_auto(args[1] == "on")
        print(f"tidyjax auto mode {args[1]}")
        return None
    if args in _TIMELINE_ARGS:
        _timeline_magic(hooks, args[1] if len(args) == 2 else "show")
        return None
    raise _usage_error(
        "usage: %tidyjax auto on|off | %tidyjax free | %tidyjax memory | "
        "%tidyjax live | %tidyjax timeline [on|off|show]"
    )


def _timeline_magic(hooks: _Hooks, what: str) -> None:
    """``%tidyjax timeline on|off|show``."""
    if what == "on":
        hooks.set_timeline(True)
        print("tidyjax timeline on: recording each cell until %tidyjax timeline off")
    elif what == "off":
        hooks.set_timeline(False)
        print("tidyjax timeline off; %tidyjax timeline shows it")
    elif hooks.last is None:
        raise _usage_error("no timeline yet: run %tidyjax timeline on, then some cells")
    else:
        from IPython.display import display

        display(hooks.last)


# -- out of memory ---------------------------------------------------------------------------


def _hidden_folders() -> tuple[str, ...]:
    """Where the frames a notebook's out-of-memory traceback leaves out live: tidyjax, JAX and
    jaxlib (``_sites.LIBRARY_FOLDERS``), and IPython's own (the cell runner)."""
    import os

    import IPython

    from ._sites import LIBRARY_FOLDERS

    return (*LIBRARY_FOLDERS, os.path.dirname(os.path.abspath(IPython.__file__)) + os.sep)


def _user_frames(tb: Any) -> Any:
    """``tb`` with the frames of tidyjax, JAX and IPython left out (None if none is left)."""
    import types

    hidden = _hidden_folders()
    kept = []
    while tb is not None:
        if not tb.tb_frame.f_code.co_filename.startswith(hidden):
            kept.append(tb)
        tb = tb.tb_next
    out = None
    for t in reversed(kept):
        out = types.TracebackType(out, t.tb_frame, t.tb_lasti, t.tb_lineno)
    return out


def _show_oom(shell: Any, etype: type, value: BaseException, tb: Any, tb_offset: Any = None) -> Any:
    """``shell.set_custom_exc``'s handler for ``OutOfMemoryError``: the report first (HTML in a
    notebook, its text in a terminal), then a short traceback of the user's frames only, ending
    in the request; JAX's chained error and the frames of tidyjax and JAX are left out
    (``%tb``, ``%debug`` and ``sys.last_exc`` still have the whole error)."""
    report = getattr(value, "report", None)
    if report is None:  # not built by tidyjax: the usual traceback
        shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
        return None
    import sys

    from IPython.display import display

    from ._errors import OutOfMemoryError

    sys.last_type, sys.last_value, sys.last_traceback = etype, value, tb
    if sys.version_info >= (3, 12):
        sys.last_exc = value
    display(report)
    try:
        first = str(value).split("\n", 1)[0]
        first = first.split(". JAX said:", 1)[0]  # JAX's own message is in the report above
        short = OutOfMemoryError(f"{first}. The report is above; err.report holds it.", report)
        short.__suppress_context__ = True
        stb = shell.InteractiveTB.structured_traceback(etype, short, _user_frames(tb))
    except Exception:  # IPython drops a handler that raises: the whole traceback instead
        shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
        return None
    shell._showtraceback(etype, short, stb)
    return None


def _install_oom_display(ip: Any) -> None:
    from ._errors import OutOfMemoryError

    if getattr(ip, "custom_exceptions", ()):  # the user's own handler: leave it
        return
    ip.set_custom_exc((OutOfMemoryError,), _show_oom)


def _uninstall_oom_display(ip: Any) -> None:
    from ._errors import OutOfMemoryError

    if getattr(ip, "custom_exceptions", ()) == (OutOfMemoryError,):
        ip.set_custom_exc((), None)


_loaded: dict[int, Any] = {}


def load_ipython_extension(ip: Any) -> None:
    """Register the ``%%tidy`` and ``%tidyjax`` magics (``%load_ext tidyjax``), and show an
    ``OutOfMemoryError`` as its report (HTML in a notebook) over a short traceback of the
    user's frames."""
    if id(ip) in _loaded:
        return
    magics = _make_magics(ip)
    ip.register_magics(magics)
    _install_oom_display(ip)
    _loaded[id(ip)] = magics


def unload_ipython_extension(ip: Any) -> None:
    """Turn auto mode and the timeline off, and the out-of-memory display
    (``%unload_ext tidyjax``)."""
    magics = _loaded.pop(id(ip), None)
    if magics is not None:
        magics.hooks.set_auto(False)
        magics.hooks.set_timeline(False)
        _uninstall_oom_display(ip)
