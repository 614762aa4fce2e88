"""``_history`` without IPython: a stand-in shell with a user namespace and an ``Out`` dict."""

from __future__ import annotations

import subprocess
import sys
import types

import jax.numpy as jnp
import pytest

import tidyjax as tj
from tidyjax._history import Decision, FreedOutput, Seen, delete_unshared


def _shell() -> types.SimpleNamespace:
    """The attributes of an IPython shell that ``_history`` reads, and nothing of IPython."""

    class Hook:  # the display hook and traceback printers: history lives in their attributes
        pass

    return types.SimpleNamespace(
        user_ns={"Out": {}, "In": [""]},
        user_ns_hidden={},
        displayhook=Hook(),
        InteractiveTB=Hook(),
        SyntaxTB=Hook(),
        last_execution_result=None,
        history_manager=Hook(),
    )


def test_history_module_does_not_import_ipython():
    code = "import sys, tidyjax._history; assert 'IPython' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_raw_arrays_only_the_output_history_holds_are_freed_and_their_entries_replaced():
    shell = _shell()
    ns, out = shell.user_ns, shell.user_ns["Out"]
    out[1] = jnp.arange(3.0)  # only the history holds it
    ns["y"] = out[2] = jnp.ones(4)  # a name holds it too
    ns["box"] = [jnp.zeros(2)]
    out[3] = ns["box"]  # a name holds the list that holds it
    ns["_1"] = out[1]

    decision = Decision(shell, {}, [], {})
    assert decision.free == {id(out[1])}
    assert decision.labels(decision.free) == {id(out[1]): "Out[1]"}

    arrays = [decision.nodes[k] for k in decision.free]
    deleted, nbytes = delete_unshared(arrays)
    del arrays
    assert deleted == {id(out[1])} and nbytes == 12
    decision.drop_history_of(deleted, "the test")
    assert isinstance(out[1], FreedOutput) and ns["_1"] is out[1]
    assert "deleted by tidyjax" in repr(out[1])
    with pytest.raises(tj.DisposedError, match=r"Out\[1\] \(_1\) \(float32\[3\]\) was freed"):
        out[1] + 1
    assert not out[2].is_deleted() and not ns["box"][0].is_deleted()


def test_tensors_outside_scopes_are_freed_by_part_of_the_history_only_when_that_part_is_theirs():
    shell = _shell()
    ns, out = shell.user_ns, shell.user_ns["Out"]
    seen = Seen(shell)
    out[1] = tj.tensor([1.0])  # an ordinary cell's output
    out[2] = tj.tensor([2.0, 3.0])  # a %%tidy cell's output
    ns["_"] = out[2]
    ns["kept"] = {"w": tj.tensor([4.0])}
    out[3] = ns["kept"]
    _, own_keys = seen.own(shell)
    assert own_keys == {1, 2, 3}

    # all of the history (auto mode): both history-only Tensors
    assert Decision(shell, {}, [], {}).free == {id(out[1]), id(out[2])}
    # only what %%tidy cells showed (Out[2]): the ordinary cell's output counts as a holder
    part = ({id(out[2])}, {2})
    assert Decision(shell, {}, [], {}, part).free == {id(out[2])}
    for t in (out[1], out[2], ns["kept"]["w"]):
        t.dispose()
