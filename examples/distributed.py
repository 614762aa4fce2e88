"""Data-parallel training under jax.distributed, each step under tidy.

On one machine, N local processes (2 CPU devices each), one command:

    python examples/distributed.py --processes 2

On real hosts, run once per host with the coordinator's address and the host's index:

    python examples/distributed.py --coordinator 10.0.0.1:1234 --num-processes 4 --process-id 0

The batch is sharded over every device of every process; the parameters and the optax state are
replicated. Each step runs in a tidy scope that hands out the new parameters and state; the
loop disposes the previous ones. Every 10 steps each process prints memory(all_processes=True),
a collective: the same totals everywhere, flat from step to step.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys


def launch_local(n: int, steps: int) -> int:
    """Start ``n`` processes of this script on this machine and wait for them."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2")
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--coordinator",
                f"127.0.0.1:{port}",
                "--num-processes",
                str(n),
                "--process-id",
                str(i),
                "--steps",
                str(steps),
                "--cpu-collectives",
            ],
            env=env,
        )
        for i in range(n)
    ]
    return max(p.wait() for p in procs)


def train(coordinator: str, n: int, pid: int, steps: int, cpu_collectives: bool) -> None:
    import jax

    if cpu_collectives:  # several processes on one machine's CPUs talk through gloo
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=n, process_id=pid)

    import jax.numpy as jnp
    import numpy as np
    import optax
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    import tidyjax as tj

    mesh = Mesh(np.array(jax.devices()), ("data",))
    batch_sharding = NamedSharding(mesh, P("data"))
    replicated = NamedSharding(mesh, P())

    def global_array(local: np.ndarray, sharding: NamedSharding) -> tj.Tensor:
        """A Tensor over a global array made of every process's local part."""
        return tj.adopt(jax.make_array_from_process_local_data(sharding, local))

    rng = np.random.default_rng(0)  # the same initial parameters on every process
    params = {
        "w1": global_array(rng.normal(size=(2, 32)).astype(np.float32) * 0.5, replicated),
        "b1": global_array(np.zeros(32, np.float32), replicated),
        "w2": global_array(rng.normal(size=(32, 1)).astype(np.float32) * 0.5, replicated),
        "b2": global_array(np.zeros(1, np.float32), replicated),
    }
    opt = optax.adam(1e-2)
    opt_state = tj.jit(opt.init, out_shardings=replicated)(params)

    def loss_fn(p: dict, x: jax.Array, y: jax.Array) -> jax.Array:
        h = jnp.tanh(x @ p["w1"] + p["b1"])
        return jnp.mean((h @ p["w2"] + p["b2"] - y) ** 2)

    @tj.jit
    def step(p: dict, s: object, x: jax.Array, y: jax.Array) -> tuple:
        loss, grads = jax.value_and_grad(loss_fn)(p, x, y)
        updates, s = opt.update(grads, s, p)
        return optax.apply_updates(p, updates), s, loss

    data_rng = np.random.default_rng(100 + pid)  # each process loads its own part of a batch
    for i in range(1, steps + 1):
        with tj.tidy("step") as scope:
            local_x = data_rng.uniform(-2, 2, size=(64, 2)).astype(np.float32)
            x = global_array(local_x, batch_sharding)
            y = global_array(np.sin(local_x[:, :1]) + 0.5 * local_x[:, 1:] ** 2, batch_sharding)
            new_params, new_state, loss = step(params, opt_state, x, y)
            scope.keep(new_params, new_state)
            value = float(loss)
        tj.dispose((params, opt_state))
        params, opt_state = new_params, new_state
        if i % 10 == 0:
            m = tj.memory(all_processes=True, scan_untracked=False)
            mine = m.per_process[pid]
            line = (
                f"[process {pid}] step {i:3d}  loss {value:.4f}  all processes: "
                f"{m.num_tensors} tensors, {m.num_bytes} B  this process: "
                f"{mine.num_tensors} tensors, {mine.num_bytes} B\n"
            )
            sys.stdout.write(line)  # one write: lines of the processes never interleave
            sys.stdout.flush()
    tj.dispose((params, opt_state))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--processes", type=int, help="start this many local processes")
    parser.add_argument("--coordinator", help="host:port of process 0 (one process per host)")
    parser.add_argument("--num-processes", type=int, default=1)
    parser.add_argument("--process-id", type=int, default=0)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--cpu-collectives", action="store_true", help="gloo, for CPU processes")
    args = parser.parse_args()
    if args.processes:
        sys.exit(launch_local(args.processes, args.steps))
    if not args.coordinator:
        parser.error("give --processes N, or --coordinator with --num-processes and --process-id")
    train(args.coordinator, args.num_processes, args.process_id, args.steps, args.cpu_collectives)


if __name__ == "__main__":
    main()
