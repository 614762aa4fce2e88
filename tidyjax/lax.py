"""``tidyjax.lax``: the public names of ``jax.lax``, callables lifted.

Each callable takes and returns Tensors. The names are generated from JAX on first use
(see ``tidyjax.lift``); dtypes and constants pass through unchanged.
"""

import jax.lax as _source

from tidyjax._lift import lifted_namespace as _lifted_namespace

__getattr__, __dir__ = _lifted_namespace(_source, __name__)
