"""Collective reports over every process of a ``jax.distributed`` job: each process tracks its
own Tensors, and a report over all of them is a collective every process calls, like any JAX
collective. The reports travel through the key-value store of JAX's distributed client (the
one ``jax.distributed.initialize`` starts), which waits with a timeout, so a process that never
calls yields a `CollectiveError` naming it instead of a silent hang.
"""

from __future__ import annotations

import itertools
import json
import os
from typing import Any

import jax

from ._errors import CollectiveError
from ._jaxdoors import distributed_client as _client  # tests/test_processes.py reads it here

__all__ = ["DEFAULT_TIMEOUT", "gather"]

#: Seconds a collective report waits for every process before raising CollectiveError.
DEFAULT_TIMEOUT = 60.0

_calls = itertools.count()


def gather(what: str, payload: dict[str, Any], timeout: float) -> list[dict[str, Any]]:
    """Every process's ``payload``, in process-index order; a collective.

    On a single process (no ``jax.distributed`` job) this is ``[payload]``.

    Raises:
        CollectiveError: ``jax.distributed`` is not initialized in a multi-process job, or some
            process did not call the same collective within ``timeout`` seconds.
    """
    n = jax.process_count()
    if n == 1:
        declared = os.environ.get("JAX_NUM_PROCESSES", "1")
        if _client() is None and (declared.isdigit() and int(declared) > 1):
            raise CollectiveError(
                f"{what} over all processes: this job declares JAX_NUM_PROCESSES={declared}, "
                "but jax.distributed.initialize() has not run in this process. Call it first, "
                "on every process, before any other JAX call."
            )
        return [payload]
    client = _client()
    if client is None:  # pragma: no cover - jax sets both together
        raise CollectiveError(
            f"{what} needs jax.distributed.initialize() on every process before it is called."
        )
    me = jax.process_index()
    key = f"tidyjax/{what}/{next(_calls)}"
    ms = max(1, int(timeout * 1000))
    client.key_value_set(f"{key}/{me}", json.dumps(payload))
    out = []
    for p in range(n):
        try:
            out.append(json.loads(client.blocking_key_value_get(f"{key}/{p}", ms)))
        except Exception as e:  # jax reports the deadline as a runtime error
            raise CollectiveError(
                f"{what} is a collective: every process must call it, in the same order. "
                f"Process {p} did not within {timeout:g} s (this is process {me} of {n}). "
                "Call it on every process, or raise the timeout (timeout=...). After this "
                "error the processes' collective reports are out of step: restart the job."
            ) from e
    # Everyone has read everyone's entry once all reach the barrier: drop ours then.
    try:
        client.wait_at_barrier(f"{key}/read", ms)
        client.key_value_delete(f"{key}/{me}")
    except Exception as e:
        raise CollectiveError(
            f"{what}: not every process finished the report within {timeout:g} s."
        ) from e
    return out
