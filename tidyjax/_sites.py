"""Creation sites: the user's line that made an array, from the traceback JAX keeps on it.

A site is the first frame outside tidyjax, JAX and installed code (site-packages, the standard
library): the line in the user's script, test or notebook cell. The first frame outside tidyjax
and JAX, when it lies in a library (``flax/nnx/...``), stays available as ``Site.detail``.

Sites cost nothing per op: JAX records a creation traceback on every array (on by default), and
tidyjax reads it only when a report asks. Imports nothing of tidyjax.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
import sysconfig
from typing import Any

import jax
import jaxlib

__all__ = ["INSTALLED_FOLDERS", "LIBRARY_FOLDERS", "Site", "creation_site", "site_of_frames"]

#: Folders whose frames are never a site: tidyjax itself, jax and jaxlib.
LIBRARY_FOLDERS: tuple[str, ...] = (
    os.path.dirname(os.path.abspath(__file__)) + os.sep,
    *(os.path.dirname(f) + os.sep for m in (jax, jaxlib) if (f := getattr(m, "__file__", None))),
)


def _installed_folders() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    folders = {paths[k] for k in ("purelib", "platlib", "stdlib", "platstdlib") if k in paths}
    folders |= {
        p for p in sys.path if p.rstrip(os.sep).endswith(("site-packages", "dist-packages"))
    }
    return tuple(sorted(os.path.abspath(f) + os.sep for f in folders if f))


#: Folders of installed code (site-packages, the standard library): a frame there is a detail,
#: the site is the user's frame that called into it.
INSTALLED_FOLDERS: tuple[str, ...] = _installed_folders()


@dataclasses.dataclass(frozen=True, slots=True)
class Site:
    """Where an array was created: the user's frame (see the module docstring).

    ``file`` is the path as Python knows it; ``str(site)`` names a notebook cell as IPython's
    tracebacks do (``In[3], line 2 in <module>``) and a file by its path relative to the
    working directory (``train.py:12 in step``). ``detail`` is the library frame that made the
    array when that is not the user's (``flax/nnx/...``), else None; it takes no part in
    equality, so arrays made at one user line group together.
    """

    file: str
    line: int
    function: str
    detail: Site | None = dataclasses.field(default=None, compare=False)

    def __str__(self) -> str:
        cell = _cell_name(self.file)
        if cell is not None:
            return f"{cell}, line {self.line} in {self.function}"
        return f"{_short_path(self.file)}:{self.line} in {self.function}"

    def __repr__(self) -> str:
        return f"Site({self.file!r}, {self.line}, {self.function!r})"


def _cell_name(file: str) -> str | None:
    """``In[3]`` for the file IPython compiled cell 3 into; None for any other file.

    Asks the running shell's compiler (IPython's own mapping, also behind its tracebacks'
    ``Cell In[3]``). Without IPython imported there is no cell: nothing is imported here.
    """
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return None
    try:
        compiler = ipython.get_ipython().compile
        fmt = getattr(compiler, "format_code_name", None)  # IPython 8.0 and later
        if fmt is not None:
            named = fmt(file)
            return None if named is None else str(named[1])
        n = compiler._filename_map.get(file)  # private to IPython: see _jaxdoors
        return None if n is None else f"In[{n}]"
    except Exception:  # no shell, or a compiler of another kind
        return None


def _short_path(file: str) -> str:
    """``file`` relative to the working directory when it lies under it."""
    if not os.path.isabs(file):
        return file
    try:
        rel = os.path.relpath(file)
    except (OSError, ValueError):  # no working directory, or another drive
        return file
    return file if rel.startswith(os.pardir) else rel


def site_of_frames(frames: Any) -> Site | None:
    """The site among ``frames`` (innermost first, each with ``file_name``, ``line_num``,
    ``function_name``, as in ``jax.Array.traceback.frames``)."""
    detail: Site | None = None
    for frame in frames:
        file = frame.file_name
        if file.startswith(LIBRARY_FOLDERS):
            continue
        if file.startswith(INSTALLED_FOLDERS):
            if detail is None:
                detail = Site(file, frame.line_num, frame.function_name)
            continue
        return Site(file, frame.line_num, frame.function_name, detail)
    return detail


def creation_site(arr: Any) -> Site | None:
    """The user's frame that created ``arr``, from JAX's creation traceback; None if JAX kept
    none (``jax_include_full_tracebacks_in_locations`` off, or an array JAX made internally)."""
    tb = getattr(arr, "traceback", None)
    if tb is None:  # a typed PRNG key: its key data array has the traceback
        tb = getattr(getattr(arr, "_base_array", None), "traceback", None)
    if tb is None:
        return None
    try:
        return _site_of_traceback(tb)
    except TypeError:  # a traceback that cannot be hashed
        return site_of_frames(tb.frames)


@functools.lru_cache(maxsize=4096)
def _site_of_traceback(tb: Any) -> Site | None:
    """The site of a JAX traceback, once per distinct traceback: arrays made at one line have
    equal tracebacks (same code objects, same instructions), and reading the frames is the
    cost. A cached traceback holds its code objects, so no other takes its place."""
    return site_of_frames(tb.frames)
