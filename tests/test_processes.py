"""tidyjax under jax.distributed: 2 processes x 2 CPU devices on this machine, with gloo.

Each test spawns the processes (a free port, a timeout, every child's output shown on failure).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tidyjax as tj

PRELUDE = textwrap.dedent(
    """
    import sys
    import jax
    pid, port, n = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}", num_processes=n, process_id=pid
    )
    import numpy as np
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import tidyjax as tj

    jax.devices()  # starting the backend is itself collective: every process does it first
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_processes(script: str, n: int = 2, timeout: float = 240) -> list[str]:
    """Run ``script`` in ``n`` processes of one jax.distributed job; return their outputs."""
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2")
    env.pop("JAX_PLATFORMS", None)
    port = str(_free_port())
    code = PRELUDE + textwrap.dedent(script)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(i), port, str(n)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(n)
    ]
    outs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=timeout)
            outs.append(out)
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        outs = [p.communicate()[0] for p in procs]
        raise AssertionError("processes timed out:\n" + _show(outs)) from None
    codes = [p.returncode for p in procs]
    assert codes == [0] * n, f"exit codes {codes}:\n" + _show(outs)
    return outs


def _show(outs: list[str]) -> str:
    def keep(line: str) -> bool:  # drop XLA's and gloo's log noise
        return not line.startswith(("W0", "I0", "[Gloo]"))

    def tail(out: str) -> str:
        kept = [ln for ln in out.splitlines() if keep(ln)]
        return "\n".join((kept or out.splitlines())[-60:])  # all of it when only logs came

    return "\n".join(f"--- process {i} ---\n{tail(out)}" for i, out in enumerate(outs))


TRAINING = """
    # JAX's distributed client, as tidyjax reads it: fail loudly if these private names move
    from tidyjax._processes import _client
    client = _client()
    for name in ("key_value_set", "blocking_key_value_get", "wait_at_barrier", "key_value_delete"):
        assert hasattr(client, name), name

    devs = jax.devices()
    assert len(devs) == 4 and len(jax.local_devices()) == 2
    mesh = Mesh(np.array(devs), ("d",))
    data, repl = NamedSharding(mesh, P("d")), NamedSharding(mesh, P())

    def global_array(local, sharding):
        return jax.make_array_from_process_local_data(sharding, local)

    w = tj.adopt(global_array(np.ones((4, 1), np.float32), repl))
    b = tj.adopt(global_array(np.zeros((1,), np.float32), repl))
    params = {"w": w, "b": b}
    assert not w.array.is_fully_addressable

    def loss_fn(p, x, y):
        return jnp.mean((x @ p["w"] + p["b"] - y) ** 2)

    @tj.jit
    def step(p, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(p, x, y)
        return jax.tree.map(lambda a, g: a - 0.1 * g, p, grads), loss

    rng = np.random.default_rng(pid)
    seen = {}
    for i in range(1, 51):
        with tj.tidy("step") as scope:
            x = tj.adopt(global_array(rng.normal(size=(8, 4)).astype(np.float32), data))
            y = x.sum(axis=1, keepdims=True)
            new, loss = step(params, x, y)
            scope.keep(new)
            # Wait for each step, as a loop that logs its loss does: CPU collectives over gloo
            # can stall with many cross-process steps in flight on a loaded machine.
            loss.block_until_ready()
        tj.dispose(params)
        params = new
        if i in (10, 50):
            m = tj.memory()
            seen[i] = (m.num_tensors, m.num_data_buffers, m.num_bytes, m.bytes_per_device)
            total = tj.memory(all_processes=True)
            assert len(total.per_process) == 2
            assert total.per_process[pid] == m, (total.per_process[pid], m)
            for field in ("num_tensors", "num_data_buffers", "num_bytes"):
                assert getattr(total, field) == sum(getattr(r, field) for r in total.per_process)
            assert set(total.bytes_per_device) == set(devs)
            assert all(r.num_bytes == total.per_process[0].num_bytes for r in total.per_process)
    assert seen[10] == seen[50], seen  # flat
    # each process holds its own shards: w (16 B replicated: 16 B here) and b (4 B)
    assert seen[50][:3] == (2, 2, 20), seen[50]
    assert set(seen[50][3]) == set(jax.local_devices())

    # disposing a global Tensor deletes this process's shards
    shards = [s.data for s in params["w"].array.addressable_shards]
    tj.dispose(params)
    assert all(s.is_deleted() for s in shards)
    del shards

    # a Variable over a global array, assigned inside a scope; donation of a global Tensor
    v = tj.Variable(tj.adopt(global_array(np.ones((2,), np.float32), data)), name="v")
    with tj.tidy():
        v.assign(v * 3)
    np.testing.assert_array_equal(np.asarray(v.array.addressable_shards[0].data), [3.0])
    double = tj.jit(lambda a: a * 2, donate_argnums=0)
    twice = double(v.clone())
    assert v.is_disposed  # the clone's buffer is v's: donated, so v is gone too
    twice.dispose()
    tj.dispose_variables()

    # a leak on process 1 only fails the check on every process, naming process 1
    try:
        with tj.check_leaks(all_processes=True, count_locals=True):
            if pid == 1:
                leak = tj.tensor([1.0, 2.0])
    except tj.LeakError as e:
        assert "process 1" in str(e) and "process 0" not in str(e), str(e)
        print(f"LEAK REPORTED {pid}")
    if pid == 1:
        leak.dispose()
    m = tj.memory(all_processes=True, scan_untracked=False)
    assert (m.num_tensors, m.num_data_buffers, m.num_bytes) == (0, 0, 0), m
    print(f"OK {pid}")
"""


def test_training_memory_leaks_and_dispose_across_two_processes():
    outs = run_processes(TRAINING)
    for i, out in enumerate(outs):
        assert f"OK {i}" in out and f"LEAK REPORTED {i}" in out, _show(outs)


TIMEOUT = """
    import time
    if pid == 0:
        try:
            tj.memory(all_processes=True, timeout=3)
        except tj.CollectiveError as e:
            assert "Process 1 did not" in str(e), str(e)
            print("TIMED OUT CLEARLY")
    else:
        time.sleep(6)  # never calls the collective
    print(f"DONE {pid}")
"""


def test_a_collective_called_by_one_process_times_out_with_a_clear_error():
    outs = run_processes(TIMEOUT)
    assert "TIMED OUT CLEARLY" in outs[0], _show(outs)


def test_all_processes_on_a_single_process_is_memory_with_one_report():
    t = tj.tensor(np.ones(3, np.float32))
    total = tj.memory(all_processes=True)
    assert total == tj.memory()
    assert total.per_process == (tj.memory(),)
    with tj.check_leaks(all_processes=True):
        u = t * 2
        u.dispose()
    t.dispose()


def test_the_distributed_example_runs_with_one_command():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(root, "examples", "distributed.py"),
            "--processes",
            "2",
            "--steps",
            "20",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    reports = re.findall(
        r"\[process (\d)\] step +(\d+) .*all processes: ([^\n]*?) +this", proc.stdout
    )
    want = [("0", "10"), ("0", "20"), ("1", "10"), ("1", "20")]
    assert sorted((p, s) for p, s, _ in reports) == want, proc.stdout
    assert len({total for _, _, total in reports}) == 1, reports  # everywhere the same: flat


PYTEST_RUN = """
    import pathlib, tempfile
    import pytest
    folder = pathlib.Path(tempfile.mkdtemp(prefix=f"tidyjax-p{pid}-"))
    (folder / "test_leaky.py").write_text(
        "import jax, pytest, tidyjax as tj\\n"
        "@pytest.mark.no_tensor_leaks\\n"
        "def test_leaks_on_process_1():\\n"
        "    if jax.process_index() == 1:\\n"
        "        pytest.leaked = tj.tensor([1.0, 2.0])\\n"
    )
    code = pytest.main([str(folder), "-q", "-p", "no:cacheprovider", "-W", "ignore"])
    print(f"PYTEST EXIT {pid} {int(code)}")
    if pid == 1:
        pytest.leaked.dispose()
"""


def test_the_pytest_plugin_fails_every_process_for_a_leak_on_one():
    outs = run_processes(PYTEST_RUN)
    for i, out in enumerate(outs):
        assert f"PYTEST EXIT {i} 1" in out, _show(outs)  # the test failed on both processes
        assert "on process 1" in out and "on process 0" not in out, _show(outs)


def test_a_declared_multi_process_job_without_initialize_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("JAX_NUM_PROCESSES", "2")
    with pytest.raises(tj.CollectiveError, match=r"jax.distributed.initialize\(\)"):
        tj.memory(all_processes=True)
    with (
        pytest.raises(tj.CollectiveError, match="JAX_NUM_PROCESSES=2"),
        tj.check_leaks(all_processes=True),
    ):
        pass
