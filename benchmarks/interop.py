"""Interop overhead: lifted tidyjax.numpy vs jax.numpy, a jitted MLP step in tidy vs raw JAX,
and the same MLP step in TensorFlow.js 4.22 (pure-JS CPU backend) for scale.

Run:  pip install ".[examples]" && python benchmarks/interop.py

Ratios compare the two sides sampled in alternation in the same run. The TF.js column needs
node and npm (it runs `npm install` in benchmarks/tfjs once); without them it is skipped.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import optax
from _timing import side_by_side

import tidyjax as tj
import tidyjax.numpy as tnp
from tidyjax import tidy

TFJS_DIR = pathlib.Path(__file__).resolve().parent / "tfjs"


def lifted_numpy(number: int, rounds: int) -> None:
    print("== tidyjax.numpy (lifted) vs jax.numpy, eager, float32[256] ==")
    print(f"{'call':28s} {'jnp µs':>9s} {'tnp µs':>9s} {'ratio':>7s}")
    x, y = jnp.linspace(0.0, 1.0, 256), jnp.linspace(1.0, 2.0, 256)
    t, u = tj.tensor(x), tj.tensor(y)
    cases = {
        "sin(x)": (lambda: jnp.sin(x), lambda: tnp.sin(t)),
        "add(x, y)": (lambda: jnp.add(x, y), lambda: tnp.add(t, u)),
        "where(x > .5, x, y)": (
            lambda: jnp.where(x > 0.5, x, y),
            lambda: tnp.where(t > 0.5, t, u),
        ),
        "dot(x, y)": (lambda: jnp.dot(x, y), lambda: tnp.dot(t, u)),
        "concatenate([x, y])": (
            lambda: jnp.concatenate([x, y]),
            lambda: tnp.concatenate([t, u]),
        ),
    }
    for name, (raw, lifted) in cases.items():
        r, w = side_by_side(raw, lifted, number, rounds, warmup=5)
        print(f"{name:28s} {r * 1e6:9.2f} {w * 1e6:9.2f} {w / r:7.3f}")
    tj.dispose([t, u])


def _mlp_data(n: int = 256, hidden: int = 32):
    rng = np.random.default_rng(0)
    x = rng.uniform(-2.0, 2.0, size=(n, 2)).astype(np.float32)
    y = (np.sin(x[:, :1]) + 0.5 * x[:, 1:] ** 2).astype(np.float32)
    k1, k2 = jax.random.split(jax.random.key(1))
    params = {
        "w1": jax.random.normal(k1, (2, hidden)) * 0.5,
        "b1": jnp.zeros(hidden),
        "w2": jax.random.normal(k2, (hidden, 1)) * 0.2,
        "b2": jnp.zeros(1),
    }
    return jnp.asarray(x), jnp.asarray(y), params


def _loss(params, x, y):
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    return ((h @ params["w2"] + params["b2"] - y) ** 2).mean()


def jitted_step(number: int, rounds: int) -> float:
    print()
    print("== one jitted MLP training step (adam, 256x2 -> 32 -> 1): raw JAX vs tidyjax in tidy ==")
    x, y, params = _mlp_data()
    opt = optax.adam(0.03)

    def update(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(_loss)(params, x, y)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    raw_step = jax.jit(update)
    raw_state = {"p": params, "s": opt.init(params)}

    def raw() -> None:
        p, s, loss = raw_step(raw_state["p"], raw_state["s"], x, y)
        raw_state["p"], raw_state["s"] = p, s
        loss.block_until_ready()

    tj_step = tj.jit(lambda p, s, x, y: update(tj_unwrap(p), tj_unwrap(s), x, y))
    tx, ty = tj.tensor(x), tj.tensor(y)
    tj_state = {"p": tj.lift(lambda p: p)(params), "s": tj.lift(opt.init)(params)}

    def tracked() -> None:
        with tidy("step"):
            p, s, loss = tj_step(tj_state["p"], tj_state["s"], tx, ty)
            tj.keep((p, s))
            loss.block_until_ready()
        tj.dispose((tj_state["p"], tj_state["s"]))
        tj_state["p"], tj_state["s"] = p, s

    r, w = side_by_side(raw, tracked, number, rounds, warmup=5)
    print(f"{'step':28s} {'jax µs':>9s} {'tidyjax µs':>11s} {'ratio':>7s}")
    print(f"{'train step':28s} {r * 1e6:9.1f} {w * 1e6:11.1f} {w / r:7.3f}")
    print(f"steps/s: raw JAX {1 / r:,.0f}, tidyjax {1 / w:,.0f}")
    tj.dispose([tj_state["p"], tj_state["s"], tx, ty])
    return 1 / w


def tj_unwrap(tree):
    """Inside jit, Tensor arguments wrap tracers; optax wants plain arrays."""
    return jax.tree_util.tree_map(
        lambda v: v.array if isinstance(v, tj.Tensor) else v,
        tree,
        is_leaf=lambda v: isinstance(v, tj.Tensor),
    )


def tfjs(steps: int, tidyjax_steps_per_s: float) -> None:
    print()
    print("== the same MLP step in TensorFlow.js 4.22 (tfjs, pure-JS CPU backend) ==")
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        print("skipped: node/npm not found on PATH")
        return
    if not (TFJS_DIR / "node_modules" / "@tensorflow" / "tfjs").exists():
        proc = subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=TFJS_DIR, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        if proc.returncode != 0:
            print(f"skipped: npm install failed: {proc.stderr.strip()[:300]}")
            return
    proc = subprocess.run(
        [node, "mlp.js", str(steps)], cwd=TFJS_DIR, capture_output=True, text=True, timeout=600
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        print(f"skipped: node mlp.js failed: {proc.stderr.strip()[-300:]}")
        return
    result = json.loads(lines[-1])
    print(f"steps/s: TensorFlow.js {result['steps_per_s']:,.0f}, "
          f"tidyjax (jitted, above) {tidyjax_steps_per_s:,.0f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--number", type=int, default=1000, help="calls per sample")
    parser.add_argument("--rounds", type=int, default=15, help="samples per side")
    parser.add_argument("--tfjs-steps", type=int, default=300)
    args = parser.parse_args()
    print(f"jax {jax.__version__} on {jax.default_backend()}, tidyjax {tj.__version__}")
    lifted_numpy(args.number, args.rounds)
    sps = jitted_step(max(1, args.number // 10), args.rounds)
    tfjs(args.tfjs_steps, sps)


if __name__ == "__main__":
    main()
