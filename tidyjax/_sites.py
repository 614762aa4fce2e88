"""Creation sites: the user's line that made an array, from the traceback JAX keeps on it.

A **user frame** is any frame outside tidyjax, JAX, the standard library and the installed
libraries tidyjax knows (`KNOWN_LIBRARIES`: NumPy, Flax, Equinox, optax, pytest, IPython, ...):
the user's script, test or notebook cell, and the user's own package, installed or not. A site
is the innermost user frame: the line that made the array. The first frame outside tidyjax and
JAX, when it lies in a library (``flax/nnx/...``), stays available as ``Site.detail``.

A site's ``chain`` is the whole chain of user frames that led to the array, outer to inner, as
``tracemalloc`` keeps a traceback: the reports group by it, so one line reached from two callers
is two groups (`Site.label` shows it: ``a.py:54 in f → b.py:154 in g``).

Sites cost nothing per op: JAX records a creation traceback on every array (on by default), and
tidyjax reads it only when a report asks, or, while a timeline records, once per distinct
traceback (`chained_site`: the timeline's sites are chains too). Imports nothing of tidyjax.

A leak check names a different frame: the *outermost* user frame inside the checked block
(`Entry.site`), the user's frames further in its ``stack``. A model's ``__call__`` that makes
the leaked Tensor is then the stack, and each line of the user's that called the model is a
site of its own.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
import sysconfig
import traceback
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import jax
import jaxlib

__all__ = [
    "CHAIN_FRAMES",
    "library_frame",
    "INSTALLED_FOLDERS",
    "KNOWN_LIBRARIES",
    "RUNNERS",
    "LIBRARY_FOLDERS",
    "PACKAGE_FOLDERS",
    "STACK_FRAMES",
    "Entry",
    "Site",
    "chained_site",
    "creation_site",
    "is_runner_file",
    "is_user_file",
    "site_of_frames",
    "site_of_stack",
]

#: Folders whose frames are never a site: tidyjax itself, jax and jaxlib.
LIBRARY_FOLDERS: tuple[str, ...] = (
    os.path.dirname(os.path.abspath(__file__)) + os.sep,
    *(os.path.dirname(f) + os.sep for m in (jax, jaxlib) if (f := getattr(m, "__file__", None))),
)


def _folders(keys: tuple[str, ...], site: bool) -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    folders = {paths[k] for k in keys if k in paths}
    if site:
        folders |= {
            p for p in sys.path if p.rstrip(os.sep).endswith(("site-packages", "dist-packages"))
        }
    return tuple(sorted(os.path.abspath(f) + os.sep for f in folders if f))


#: Folders of installed packages (site-packages): a package there is the user's own unless its
#: top-level name is in `KNOWN_LIBRARIES`.
PACKAGE_FOLDERS: tuple[str, ...] = _folders(("purelib", "platlib"), site=True)

#: Folders of installed code (site-packages, the standard library): a frame there in a library
#: is a detail, the site is the user's frame that called into it.
INSTALLED_FOLDERS: tuple[str, ...] = tuple(
    sorted({*PACKAGE_FOLDERS, *_folders(("stdlib", "platstdlib"), site=False)})
)

#: Installed libraries (top-level module names) whose frames are never user frames, besides
#: tidyjax, JAX and the standard library. Names starting with one of `_KNOWN_PREFIXES` too.
KNOWN_LIBRARIES: frozenset[str] = frozenset({
    # arrays and the JAX ecosystem
    "numpy", "scipy", "ml_dtypes", "opt_einsum", "flax", "flaxlib", "flaxlib_src", "equinox",
    "optax", "chex", "haiku", "orbax", "jraph", "jaxtyping", "treescope", "penzai", "etils",
    "tensorstore", "lineax", "optimistix", "diffrax", "distrax", "numpyro", "blackjax", "jmp",
    "einops", "tree", "wadler_lindig", "typeguard", "beartype", "msgpack", "absl", "grain",
    # other frameworks and data libraries
    "tensorflow", "tensorflow_datasets", "tf_keras", "keras", "torch", "torchvision",
    "transformers", "datasets", "huggingface_hub", "safetensors", "pandas", "sklearn", "PIL",
    "matplotlib", "tqdm", "cloudpickle", "dill", "wandb", "mlflow", "tensorboard",
    "tensorboardX", "hydra", "omegaconf", "ray", "dask", "fsspec", "rich", "click", "typer",
    # test runners, notebooks, event loops, debuggers
    "pytest", "_pytest", "pluggy", "xdist", "execnet", "hypothesis", "py", "coverage",
    "IPython", "ipykernel", "ipykernel_launcher", "ipywidgets", "comm", "traitlets", "tornado",
    "zmq", "nbclient", "nbconvert", "nbformat", "notebook", "jupyter", "jupyterlab", "anyio",
    "trio", "uvloop", "nest_asyncio", "nest_asyncio2", "debugpy", "pydevd", "_pydevd_bundle",
    "_pydev_bundle", "_pydevd_frame_eval", "pdb", "setuptools", "pkg_resources", "_distutils_hack",
    "typing_extensions", "six", "attr", "attrs", "importlib_metadata", "zipp",
})  # fmt: skip
_KNOWN_PREFIXES = ("_pytest", "pytest_", "_hypothesis", "jupyter_", "jax_", "ipython_")

#: Of `KNOWN_LIBRARIES`, those that run the user's code (test runners, notebook kernels, event
#: loops, debuggers): a chain of user frames ends at their frames, so the code they ran from
#: strings (``<string>``: xdist's worker, a debugger) never joins it.
RUNNERS: frozenset[str] = frozenset({
    "pytest", "_pytest", "pluggy", "xdist", "execnet", "hypothesis", "coverage", "IPython",
    "ipykernel", "ipykernel_launcher", "tornado", "zmq", "nbclient", "notebook", "jupyter",
    "jupyterlab", "anyio", "trio", "uvloop", "nest_asyncio", "nest_asyncio2", "debugpy",
    "pydevd", "_pydevd_bundle", "_pydev_bundle", "_pydevd_frame_eval", "pdb", "absl", "hydra",
    "click", "typer", "ray", "dask",
})  # fmt: skip


@dataclasses.dataclass(frozen=True, slots=True)
class Site:
    """Where an array was created: the user's frame (see the module docstring).

    ``file`` is the path as Python knows it; ``str(site)`` names a notebook cell as IPython's
    tracebacks do (``In[3], line 2 in <module>``) and a file by its path relative to the
    working directory (``train.py:12 in step``). ``detail`` is the library frame that made the
    array when that is not the user's (``flax/nnx/...``), else None; it takes no part in
    equality, so arrays made at one user line group together.

    ``stack``: for a leak check's site (the outermost user frame inside the checked block), the
    user's frames further in that led to the array, innermost first (the line
    that made it first); empty otherwise. It takes no part in equality either.

    ``chain``: every user frame that led to the array, outer to inner (for a leak check's site,
    from the checked block's line inward), each a ``Site`` of its own; empty when the site's
    own frame is all there is (``frames`` then gives that frame alone). It takes part in
    equality: the reports group by it, as ``tracemalloc`` groups by traceback. ``label`` shows
    it, ``str()`` the site's own frame alone.
    """

    file: str
    line: int
    function: str
    detail: Site | None = dataclasses.field(default=None, compare=False)
    stack: tuple[Site, ...] = dataclasses.field(default=(), compare=False)
    chain: tuple[Site, ...] = dataclasses.field(default=(), repr=False)

    @property
    def frames(self) -> tuple[Site, ...]:
        """The chain of user frames, outer to inner: ``chain``, or the site's own frame."""
        return self.chain or (Site(self.file, self.line, self.function),)

    @property
    def label(self) -> str:
        """The chain, outer to inner: ``a.py:54 in f → b.py:154 in g``; at most `CHAIN_FRAMES`
        frames, the middle elided (``…``)."""
        frames = [str(f) for f in self.frames]
        if len(frames) > CHAIN_FRAMES:
            head = CHAIN_FRAMES // 2
            frames = [*frames[:head], "…", *frames[head - CHAIN_FRAMES :]]
        return " → ".join(frames)

    def __str__(self) -> str:
        cell = _cell_name(self.file)
        if cell is not None:
            return f"{cell}, line {self.line} in {self.function}"
        return f"{_short_path(self.file)}:{self.line} in {self.function}"

    def __repr__(self) -> str:
        chain = f", chain={self.chain!r}" if self.chain else ""
        return f"Site({self.file!r}, {self.line}, {self.function!r}{chain})"


def library_frame(site: Site) -> str:
    """A library frame (``Site.detail``) named from its package: ``flax/nnx/rnglib.py:12 in
    __call__``, not the full path into site-packages."""
    folders = [f for f in INSTALLED_FOLDERS if site.file.startswith(f)]
    file = site.file[len(max(folders, key=len)) :] if folders else site.file  # the innermost
    return f"{file}:{site.line} in {site.function}"


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
    ``function_name``, as in ``jax.Array.traceback.frames``): the innermost user frame, without
    its chain (`creation_site` adds it)."""
    detail: Site | None = None
    for frame in frames:
        file = frame.file_name
        if file.startswith(LIBRARY_FOLDERS):
            continue
        if not is_user_file(file):
            if detail is None:
                detail = Site(file, frame.line_num, frame.function_name)
            continue
        return Site(file, frame.line_num, frame.function_name, detail)
    return detail


def chained_site(frames: list[Any]) -> Site | None:
    """The site among ``frames`` (a list, innermost first, as `site_of_frames` takes them) with
    its chain: the user frames up to the first frame of a runner (`RUNNERS`), outer to inner.
    What `creation_site` gives for the traceback holding ``frames``."""
    return _chained(site_of_frames(frames), frames)


def _chained(site: Site | None, frames: list[Any]) -> Site | None:
    """``site`` with its chain: the user frames among ``frames`` (a list, innermost first),
    outer to inner; ``site`` itself when it is its only frame."""
    if site is None:
        return None
    kept = []
    for f in frames:  # innermost first: up to the first frame of a runner (`RUNNERS`)
        if is_runner_file(f.file_name):
            break
        if is_user_file(f.file_name):
            kept.append(Site(f.file_name, f.line_num, f.function_name))
    chain = tuple(reversed(kept))
    return dataclasses.replace(site, chain=chain) if len(chain) > 1 else site


def site_of_stack(frame: Any, lines: Mapping[int, int] | None = None) -> Site | None:
    """The site among the running ``frame`` and its callers; ``lines``: by a frame's id, the
    line to read for it instead of the one it runs now."""
    lines = lines or {}
    return site_of_frames(
        SimpleNamespace(file_name=f.f_code.co_filename, function_name=f.f_code.co_name,
                        line_num=lines.get(id(f), line))
        for f, line in traceback.walk_stack(frame)
    )  # fmt: skip


@functools.lru_cache(maxsize=8192)
def is_runner_file(file: str) -> bool:
    """Whether a frame in ``file`` belongs to a package that runs the user's code (`RUNNERS`):
    a chain of user frames, walked outward, ends there."""
    folders = [f for f in PACKAGE_FOLDERS if file.startswith(f)]
    if not folders:
        return False
    folder = max(folders, key=len)
    top = file[len(folder) :].split(os.sep, 1)[0].split(".", 1)[0]
    return top in RUNNERS or top.startswith(("_pytest", "pytest_", "_hypothesis"))


@functools.lru_cache(maxsize=8192)
def is_user_file(file: str) -> bool:
    """Whether a frame in ``file`` is a user frame (see the module docstring): not tidyjax's,
    JAX's or the standard library's, and not in an installed package of `KNOWN_LIBRARIES`
    (the user's own installed package is a user frame). Cached per file: a chain asks of
    every frame."""
    if file.startswith((*LIBRARY_FOLDERS, "<frozen ")):
        return False
    folders = [f for f in INSTALLED_FOLDERS if file.startswith(f)]
    if not folders:
        return True
    folder = max(folders, key=len)  # site-packages may lie inside the standard library's
    if folder not in PACKAGE_FOLDERS:  # the standard library
        return False
    top = file[len(folder) :].split(os.sep, 1)[0].split(".", 1)[0]  # a package, or a module
    return top not in KNOWN_LIBRARIES and not top.startswith(_KNOWN_PREFIXES)


#: The most frames of a leak site's ``stack``.
STACK_FRAMES = 8
#: The most frames ``Site.label`` shows of a chain (the middle elided).
CHAIN_FRAMES = 8


class Entry:
    """The frame in which a leak check was entered, to find in an array's creation traceback.

    ``Entry.site(arr)`` is the **outermost user frame inside the checked block**: walking the
    traceback from the entering frame inward, the first frame outside tidyjax, JAX and installed
    code. For ``with check_leaks():`` that is the entering function's own frame, at the line of
    the block that led to the array (``monitor.append(model(x))``, not the line inside
    ``model.__call__``); for the decorator form, whose entering frame is tidyjax's wrapper, the
    decorated function's line. The user frames further in are its ``stack`` (innermost first),
    the library frame that made the array, if any, its ``detail``, and all of them, from the
    site inward, its ``chain`` (what a leak report groups by).

    The entering frame is found by its code (file, qualified name, first line) at the depth it
    had when the check was entered, else at any depth (the outermost such frame: a generator
    resumed from elsewhere). When the traceback does not hold it, the nearest of its callers
    that the traceback holds at its depth takes its place: a check entered by the pytest
    plugin's hook (a generator around the test) has the test function as its site, the first
    user frame below the hook's caller. With none of them (an array made by another thread),
    the outermost user frame of the whole traceback is the site: the thread's function.
    """

    __slots__ = ("chain", "depth")

    def __init__(self, frame: Any) -> None:
        # (file, qualified name, first line) of the entering frame and of each of its callers
        chain: list[tuple[str, str, int]] = []
        while frame is not None:
            code = frame.f_code
            chain.append(
                (code.co_filename, getattr(code, "co_qualname", code.co_name), code.co_firstlineno)
            )
            frame = frame.f_back
        self.chain = chain
        self.depth = len(chain)  # frames from the entering one out, itself included

    @staticmethod
    def _is(frame: Any, code: tuple[str, str, int]) -> bool:
        return (
            frame.file_name == code[0]
            and frame.function_name == code[1]
            and getattr(frame, "function_start_line", code[2]) == code[2]
        )

    def _index(self, frames: list[Any]) -> int:
        """The index in ``frames`` (innermost first) of the entering frame, or of the nearest
        of its callers found at its depth; ``len(frames)`` when there is none."""
        if not self.chain:
            return len(frames)
        n = len(frames)
        i = n - self.depth
        if 0 <= i < n and self._is(frames[i], self.chain[0]):
            return i
        for j in range(n - 1, -1, -1):  # outermost first: a generator resumed elsewhere
            if self._is(frames[j], self.chain[0]):
                return j
        for k, code in enumerate(self.chain[1:], 1):  # its callers, nearest first
            i = n - self.depth + k
            if 0 <= i < n and self._is(frames[i], code):
                return i
        return n

    def site_of_frames(self, frames: list[Any]) -> Site | None:
        """The site among ``frames`` (innermost first, as ``jax.Array.traceback.frames``)."""
        user = [j for j in range(min(self._index(frames), len(frames) - 1), -1, -1)
                if is_user_file(frames[j].file_name)]  # fmt: skip
        if not user:  # no user frame inside the block: the innermost user frame anywhere
            return chained_site(frames)
        outer, inner = user[0], user[1:]
        detail = None
        for frame in frames[: inner[-1] if inner else outer]:  # below the innermost user frame
            if not frame.file_name.startswith(LIBRARY_FOLDERS):  # a library's
                detail = Site(frame.file_name, frame.line_num, frame.function_name)
                break
        stack = tuple(
            Site(frames[j].file_name, frames[j].line_num, frames[j].function_name)
            for j in reversed(inner[-STACK_FRAMES:])
        )
        chain = tuple(
            Site(frames[j].file_name, frames[j].line_num, frames[j].function_name) for j in user
        )
        f = frames[outer]
        return Site(f.file_name, f.line_num, f.function_name, detail, stack,
                    chain if len(chain) > 1 else ())  # fmt: skip

    def site(self, arr: Any, cache: dict[Any, Site | None] | None = None) -> Site | None:
        """The leak site of ``arr`` (see the class docstring); None where JAX kept no
        traceback. ``cache``: sites already found, by traceback."""
        tb = getattr(arr, "traceback", None)
        if tb is None:  # a typed PRNG key: its key data array has the traceback
            tb = getattr(getattr(arr, "_base_array", None), "traceback", None)
        if tb is None:
            return None
        if cache is None:
            return self.site_of_frames(list(tb.frames))
        try:
            return cache[tb]
        except KeyError:
            found = cache[tb] = self.site_of_frames(list(tb.frames))
            return found
        except TypeError:  # a traceback that cannot be hashed
            return self.site_of_frames(list(tb.frames))


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
        return chained_site(list(tb.frames))


@functools.lru_cache(maxsize=4096)
def _site_of_traceback(tb: Any) -> Site | None:
    """The site of a JAX traceback with its chain, once per distinct traceback: arrays made
    at one line have equal tracebacks (same code objects, same instructions), and reading the
    frames is the cost. A cached traceback holds its code objects, so no other takes its
    place."""
    return chained_site(list(tb.frames))
