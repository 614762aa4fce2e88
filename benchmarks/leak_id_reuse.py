"""100 checks of a one-array leak in a step that replaces all 200 arrays of its state.

Every array alive at each check's entry dies inside it, so the leaked array is free to take a
dead one's ``id()``: a check that told old from new arrays by id missed it in 12 to 15 of 20
checks. Run: ``python benchmarks/leak_id_reuse.py``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

import tidyjax as tj


@jax.jit
def step(state):
    return [s + 1 for s in state]


def leak_one(cache):
    cache.append(jnp.zeros(4) + 1)


state = step([jnp.full(4, float(i)) for i in range(200)])  # compiled before the checks
leak_one([])
cache = []
exact = 0
for _ in range(100):
    try:
        with tj.check_leaks() as checker:
            state = step(state)  # every array alive at the check's entry dies inside
            checker.allow(state)  # the new state is the loop's result
            leak_one(cache)  # the one leak
    except tj.LeakError as err:
        exact += len(err.report.arrays) == 1 and not err.report.tensors
    cache.clear()
print(f"the one leaked array found, alone, in {exact} of 100 checks")
