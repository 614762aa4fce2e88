"""tidyjax: TensorFlow.js-style deterministic memory management for JAX.

Wrap values in `Tensor`, run code under `tidy`, and every intermediate device
buffer is freed the moment the scope ends, whatever else references the raw arrays.
"""

from importlib.metadata import PackageNotFoundError as _PackageNotFoundError
from importlib.metadata import version as _version

from . import _interop, _oom
from ._budget import budget as budget
from ._census import Site as Site
from ._census import SiteStat as SiteStat
from ._census import TensorRecord as TensorRecord
from ._census import live_tensors as live_tensors
from ._errors import BudgetError as BudgetError
from ._errors import CollectiveError as CollectiveError
from ._errors import DisposedError as DisposedError
from ._errors import LeakError as LeakError
from ._errors import OutOfMemoryError as OutOfMemoryError
from ._errors import ScopeError as ScopeError
from ._errors import TidyjaxError as TidyjaxError
from ._errors import TidyjaxTypeError as TidyjaxTypeError
from ._errors import TidyjaxValueError as TidyjaxValueError
from ._leaks import LeakReport as LeakReport
from ._leaks import check_leaks as check_leaks
from ._lift import grad as grad
from ._lift import jit as jit
from ._lift import value_and_grad as value_and_grad
from ._lift import vmap as vmap
from ._memory import MemoryInfo as MemoryInfo
from ._memory import memory as memory
from ._oom import OOMReport as OOMReport
from ._oom import oom_report as oom_report
from ._ops import install_tensor_methods as _install_tensor_methods
from ._ops import lift as lift
from ._plan import MemoryPlan as MemoryPlan
from ._plan import largest_fitting as largest_fitting
from ._plan import plan as plan
from ._profile import KernelRecord as KernelRecord
from ._profile import ProfileInfo as ProfileInfo
from ._profile import profile as profile
from ._scope import Scope as Scope
from ._scope import dispose as dispose
from ._scope import keep as keep
from ._scope import tidy as tidy
from ._snapshot import SiteDiff as SiteDiff
from ._snapshot import Snapshot as Snapshot
from ._snapshot import snapshot as snapshot
from ._tensor import Tensor as Tensor
from ._tensor import adopt as adopt
from ._tensor import tensor as tensor
from ._timeline import Timeline as Timeline
from ._timeline import timeline as timeline
from ._trees import arrays as arrays
from ._trees import is_tensor as is_tensor
from ._trees import tensors as tensors
from ._variable import Variable as Variable
from ._variable import dispose_variables as dispose_variables
from ._watch import unwatch as unwatch
from ._watch import watch as watch
from .ipython import load_ipython_extension as load_ipython_extension
from .ipython import unload_ipython_extension as unload_ipython_extension

_install_tensor_methods()
_oom.install()  # out-of-memory reports: the core's error hook
_interop.install()

from . import lax as lax  # noqa: E402 - the lifted namespaces need the Tensor methods above
from . import nn as nn  # noqa: E402
from . import numpy as numpy  # noqa: E402
from . import random as random  # noqa: E402

# The public surface, as docs/api.md documents it (tests/test_api.py checks both ways). The
# lifted namespaces (numpy, lax, nn, random) are submodules, not listed: `import *` must not
# shadow the real numpy and random.
__all__ = [
    # scopes
    "tidy", "Scope", "keep", "dispose",
    # Tensors and Variables
    "Tensor", "tensor", "adopt", "Variable", "dispose_variables",
    # JAX interop
    "lift", "jit", "grad", "value_and_grad", "vmap", "is_tensor", "arrays", "tensors",
    # memory and reports
    "memory", "MemoryInfo", "watch", "unwatch", "profile",
    "ProfileInfo", "KernelRecord", "live_tensors", "TensorRecord", "Site", "snapshot", "Snapshot",
    "SiteStat", "SiteDiff", "check_leaks", "LeakReport", "timeline", "Timeline", "oom_report",
    "OOMReport",
    # a plan before running, a budget
    "plan", "MemoryPlan", "largest_fitting", "budget",
    # notebooks
    "load_ipython_extension", "unload_ipython_extension",
    # errors
    "TidyjaxError", "DisposedError", "ScopeError", "CollectiveError", "LeakError",
    "OutOfMemoryError", "BudgetError", "TidyjaxTypeError", "TidyjaxValueError",
]  # fmt: skip

# Public classes print and pickle as ``tidyjax.X``, not by the private module that defines them.
for _name in __all__:
    _obj = globals()[_name]
    if isinstance(_obj, type) and _obj.__module__.startswith("tidyjax."):
        _obj.__module__ = "tidyjax"
del _name, _obj

try:
    __version__ = _version("tidyjax")
except _PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0+unknown"
