"""Hooks into optional libraries, installed when (and only if) the library is imported.

tidyjax depends on jax alone. ``flax.serialization`` keeps its own registry of node types: a
Tensor is registered there the moment flax's module is loaded (or at once, if it already is),
so ``flax.serialization.to_bytes``/``from_bytes`` round-trip trees of Tensors and Variables.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from ._tensor import Tensor, tensor

__all__ = ["install"]


def _to_state(t: Tensor) -> Any:
    return t._value()


def _from_state(target: Tensor, state: Any) -> Tensor:
    """A restored leaf: a Variable like the target (name, trainable), else a tracked Tensor."""
    var = getattr(target, "_var", None)
    if var is None:
        return tensor(state)
    from ._variable import Variable

    return Variable(state, name=var.name, trainable=var.trainable)


def _register_flax(module: ModuleType) -> None:
    module.register_serialization_state(Tensor, _to_state, _from_state, override=True)


_HOOKS: dict[str, Callable[[ModuleType], None]] = {"flax.serialization": _register_flax}


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
