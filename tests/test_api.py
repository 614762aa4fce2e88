"""The public surface: names, modules, exception hierarchy."""

from __future__ import annotations

import tidyjax as tj

PUBLIC = {
    "DisposedError", "LeakError", "MemoryInfo", "Scope", "ScopeError", "Tensor", "TidyjaxError",
    "TidyjaxTypeError", "TidyjaxValueError", "Variable", "adopt", "dispose", "dispose_variables",
    "keep", "memory", "tensor", "tidy", "lift", "jit", "grad", "value_and_grad", "vmap",
    "profile", "ProfileInfo", "KernelRecord", "live_tensors", "TensorRecord", "Site", "snapshot",
    "Snapshot", "SiteStat", "SiteDiff", "check_leaks", "LeakReport", "CollectiveError",
}  # fmt: skip


def test_public_names_are_exported():
    exported = {n for n in dir(tj) if not n.startswith("_")}
    assert exported >= PUBLIC


def test_classes_print_as_tidyjax():
    for cls in (tj.Tensor, tj.Variable, tj.DisposedError, tj.ScopeError):
        assert cls.__module__ == "tidyjax"


def test_exceptions_mix_in_the_builtin():
    assert issubclass(tj.DisposedError, (tj.TidyjaxError, RuntimeError))
    assert issubclass(tj.ScopeError, RuntimeError)
    assert issubclass(tj.TidyjaxTypeError, TypeError)
    assert issubclass(tj.TidyjaxValueError, ValueError)
    assert issubclass(tj.CollectiveError, (tj.TidyjaxError, RuntimeError))
    assert all(issubclass(e, tj.TidyjaxError) for e in (tj.DisposedError, tj.LeakError))


def test_version():
    assert tj.__version__ and tj.__version__[0].isdigit()
