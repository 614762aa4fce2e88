"""Hooks into optional libraries, installed when (and only if) the library is imported.

tidyjax depends on jax alone. Each hook runs the moment its module is loaded (or at once, if it
already is):

* ``flax.serialization`` keeps its own registry of node types: a Tensor is registered there, so
  ``flax.serialization.to_bytes``/``from_bytes`` round-trip trees of Tensors and Variables.
* ``jax.example_libraries.optimizers``: an ``OptimizerState`` records the structure of the
  parameter tree and refuses a gradient tree of another structure. ``tensors(state)`` also
  gives that record Tensor nodes (``_trees.TENSORS_HOOKS``), so ``tensors(opt_init(params))``
  steps with the gradient of the Tensors ``get_params`` gives back, as
  ``opt_init(tensors(params))`` does.
* ``equinox``: ``eqx.combine(params, static)`` where ``params`` holds Tensors and ``static``
  (partitioned from raw arrays) holds ``None`` in their place: a Tensor node meets ``None``, a
  pytree structure error. ``eqx.combine`` takes such a Tensor as a leaf instead (tried only after
  Equinox's own combine refused the trees).
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys
import weakref
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import jax

from ._lift import RAW_WHEN_TRACED
from ._tensor import TENSOR_TYPES, Tensor, held_array, shell, tensor
from ._trees import TENSORS_HOOKS, tensors_in

__all__ = ["install"]


def _to_state(t: Tensor) -> Any:
    return t.array


def _from_state(target: Tensor, state: Any) -> Tensor:
    """A restored leaf: a Variable like the target (name, trainable), else a tracked Tensor."""
    var = getattr(target, "_var", None)
    if var is None:
        return tensor(state)
    from ._variable import Variable

    return Variable(state, name=var.name, trainable=var.trainable)


def _register_flax(module: ModuleType) -> None:
    module.register_serialization_state(Tensor, _to_state, _from_state, override=True)


#: A leaf of the structure an ``OptimizerState`` records (any value that is a pytree leaf).
_LEAF = object()


def _optimizer_state_tensors(state: Any) -> Any:
    """``tensors()`` of an ``OptimizerState``: its recorded parameter structure gets a Tensor
    node over each parameter whose state leaves are all Tensors (what ``get_params`` rebuilds
    there, and so what a gradient of it holds). A node already there stays: idempotent."""
    packed, tree_def, _ = state
    if len(packed) != tree_def.num_leaves:
        return state  # not a state this hook knows
    node = shell(_LEAF)  # a Tensor node over a leaf; a Tensor node rebuilt over it is it
    marks = [
        node if leaves and all(type(v) in TENSOR_TYPES for v in leaves) else _LEAF
        for leaves in packed
    ]
    rebuilt = jax.tree_util.tree_unflatten(tree_def, marks)
    return state._replace(tree_def=jax.tree_util.tree_structure(rebuilt))


def _register_example_optimizers(module: ModuleType) -> None:
    TENSORS_HOOKS[module.OptimizerState] = _optimizer_state_tensors
    # Its update compares each parameter's new state with the structure recorded at init: inside
    # a tidyjax transformation it computes on JAX's values, as under jax.jit, not on shells.
    RAW_WHEN_TRACED.add(module.OptimizerState)


def _is_filled_tensor(x: Any) -> bool:
    """A Tensor holding a value: not a shell around ``None`` (a partition's filtered-out leaf)."""
    return type(x) in TENSOR_TYPES and held_array(x) is not None


# the combines made by `_combine_taking_tensors` (a module hooked twice is not wrapped again)
_COMBINES: weakref.WeakSet[Callable[..., Any]] = weakref.WeakSet()


def _combine_taking_tensors(combine: Callable[..., Any]) -> Callable[..., Any]:
    """``eqx.combine`` that, where Equinox's own refuses the trees and a Tensor is in them,
    combines again with each Tensor a leaf (a shell around ``None`` counting as ``None``)."""
    if combine in _COMBINES:
        return combine

    @functools.wraps(combine)
    def combine_(*pytrees: Any, is_leaf: Callable[[Any], bool] | None = None) -> Any:
        try:
            return combine(*pytrees, is_leaf=is_leaf)
        except ValueError as e:
            if not tensors_in(pytrees):
                raise
            error = e

        def leaf(x: Any) -> bool:
            return type(x) in TENSOR_TYPES or (is_leaf is not None and is_leaf(x))

        def none_for_empty(x: Any) -> Any:
            return x if type(x) not in TENSOR_TYPES or _is_filled_tensor(x) else None

        plain = [jax.tree_util.tree_map(none_for_empty, t, is_leaf=leaf) for t in pytrees]
        try:
            return combine(*plain, is_leaf=leaf)
        except ValueError:
            raise error from None

    _COMBINES.add(combine_)
    return combine_


def _hook_equinox(module: ModuleType) -> None:
    combine = getattr(module, "combine", None)
    if combine is not None:
        vars(module)["combine"] = _combine_taking_tensors(combine)


_HOOKS: dict[str, Callable[[ModuleType], None]] = {
    "flax.serialization": _register_flax,
    "jax.example_libraries.optimizers": _register_example_optimizers,
    "equinox": _hook_equinox,
}


class _Finder(importlib.abc.MetaPathFinder):
    """Runs a hook right after its module has loaded; finds nothing itself."""

    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        hook = _HOOKS.get(name)
        if hook is None:
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader.exec_module = _then(spec.loader.exec_module, hook)  # type: ignore[method-assign,assignment]
                return spec
        return None


def _then(
    exec_module: Callable[[ModuleType], None], hook: Callable[[ModuleType], None]
) -> Callable[[ModuleType], None]:
    def exec_and_hook(module: ModuleType) -> None:
        exec_module(module)
        hook(module)

    return exec_and_hook


def install() -> None:
    """Register with the optional libraries already imported; hook the ones imported later."""
    for name, hook in _HOOKS.items():
        module = sys.modules.get(name)
        if module is not None:
            hook(module)
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
