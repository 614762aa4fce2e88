"""Write the notebooks and execute them in a real kernel, saving their outputs.

Run:  pip install -e ".[notebooks]" optax && python notebooks/build.py [NAME.ipynb ...]

The committed .ipynb files are this script's output; tests/test_notebooks.py runs them again.
"""

from __future__ import annotations

import pathlib
import sys

import nbformat
from nbclient import NotebookClient
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = pathlib.Path(__file__).resolve().parent

QUICKSTART = [
    new_markdown_cell(
        "# tidyjax quickstart\n\n"
        "JAX frees a device buffer only when the last Python reference to its array dies. "
        "In a notebook, `Out[]`, `_` and tracebacks keep references alive. tidyjax wraps arrays "
        "in tracked `Tensor`s, and frees every buffer a `tidy` scope made when the scope ends, "
        "except what leaves it."
    ),
    new_code_cell("import tidyjax as tj\nfrom tidyjax import tidy\n\n%load_ext tidyjax"),
    new_markdown_cell(
        "## `dispose()`\n\nThe seed's first example: `a.add(b)` makes a third tensor."
    ),
    new_code_cell(
        "a = tj.tensor([1, 2, 3, 4])\n"
        "b = tj.tensor([5, 6, 7, 8])\n"
        "c = a.add(b)\n"
        'print("after a.add(b):", tj.memory().num_tensors, "tensors")\n'
        "c.dispose()\n"
        'print("after c.dispose():", tj.memory().num_tensors, "tensors")\n'
        "tj.dispose([a, b])\n"
        'print("after tj.dispose([a, b]):", tj.memory().num_tensors, "tensors")'
    ),
    new_markdown_cell(
        "## `tidy`\n\nEverything created inside is freed when the scope ends, except what it returns."
    ),
    new_code_cell(
        "def body():\n"
        "    x = tj.tensor([1, 2, 3, 4])\n"
        "    y = tj.tensor([5, 6, 7, 8])\n"
        "    body.inner = (x, y)\n"
        "    return x.add(y)\n\n"
        "result = tidy.run(body)\n"
        'print("x, y disposed:", [t.is_disposed for t in body.inner])\n'
        'print("result:", result, "| tensors alive:", tj.memory().num_tensors)'
    ),
    new_markdown_cell(
        "## Nested `tidy`\n\n`b` is freed when the inner scope ends; `a` and the inner result live "
        "on until the outer one ends."
    ),
    new_code_cell(
        "def outer():\n"
        "    a = tj.tensor([1, 2, 3])\n"
        "    def inner():\n"
        "        b = tj.tensor([4, 5, 6])\n"
        "        outer.b = b\n"
        "        return a.mul(b)\n"
        "    inner_result = tidy.run(inner)\n"
        '    print("b disposed after the inner tidy:", outer.b.is_disposed)\n'
        "    return inner_result.add(a)\n\n"
        "final = tidy.run(outer)\n"
        'print("final:", final, "| tensors alive:", tj.memory().num_tensors)'
    ),
    new_markdown_cell(
        "## Every form of `tidy`, `keep`, and Variables\n\n"
        "`with tidy(...)`, `@tidy`, `async with tidy()`, `tidy.run`. Use `scope.keep` to hand a "
        "value out like a return value, `tj.keep` to protect from every scope, and a `Variable` "
        "for state that no scope frees."
    ),
    new_code_cell(
        'w = tj.Variable(tj.tensor([[0.5], [0.25]]), name="w")\n\n'
        '@tidy("step")\n'
        "def step(x):\n"
        "    err = x @ w - 2.0\n"
        "    w.assign(w - 0.1 * (x.T @ err))   # the new value lives on inside the Variable\n"
        "    return (err * err).mean()\n\n"
        "x = tj.tensor([[1.0, 2.0]])\n"
        "losses = [step(x).item() for _ in range(3)]\n"
        'print("losses:", [round(v, 4) for v in losses])\n'
        'with tidy("block") as scope:\n'
        "    t = x * 3\n"
        "    out = scope.keep(t + 1)\n"
        "print(scope)\n"
        'print("tensors alive:", tj.memory().num_tensors)'
    ),
    new_markdown_cell(
        "## Using a disposed Tensor\n\nThe error says what freed it and how to keep it."
    ),
    new_code_cell("try:\n    t + 1\nexcept tj.DisposedError as err:\n    print(err)"),
    new_markdown_cell(
        "## Rich display\n\nA Tensor shows its dtype, shape, device, bytes and a few values."
    ),
    new_code_cell("out"),
    new_markdown_cell(
        "## `%%tidy`: a scope around a cell\n\n"
        "Tensors the cell's names still hold survive. Everything else is freed, even what "
        "`Out[]` and `_` hold."
    ),
    new_code_cell(
        "%%tidy cell\n"
        "h = tj.tensor([1.0, 2.0, 3.0])\n"
        "g = (h * 2).exp()\n"
        "g.sum()   # shown, then freed"
    ),
    new_code_cell(
        'print("h, g alive:", not h.is_disposed, not g.is_disposed, "| _ disposed:", _.is_disposed)'
    ),
    new_markdown_cell(
        "## `profile()`\n\nThe TF.js example: 12 new bytes in 1 tensor, and two `square` kernels "
        "of 12 bytes each. The peak and the totals include the tensors already alive in this "
        "notebook."
    ),
    new_code_cell(
        "def squares():\n"
        "    x = tj.tensor([1.0, 2.0, 3.0])\n"
        "    x2 = x.square(); x2.dispose()\n"
        "    x2 = x.square(); x2.dispose()\n"
        "    return x\n\n"
        "info = tj.profile(squares)\n"
        "info"
    ),
    new_markdown_cell(
        "## Finding leaks\n\n"
        "`%tidyjax live` groups the live tensors by the line that created them. `check_leaks` "
        "fails when a block leaves tensors alive."
    ),
    new_code_cell("leaky = [x * i for i in range(3)]\n%tidyjax live"),
    new_code_cell(
        "try:\n"
        "    with tj.check_leaks():\n"
        "        leaky.append(x + 1)\n"
        "except tj.LeakError as err:\n"
        "    print(err)"
    ),
    new_markdown_cell(
        "## Memory over time\n\n"
        "`%tidyjax timeline on` records every allocation and free while cells run, each cell a "
        "band named like its prompt; `%tidyjax timeline` shows the chart: live bytes by creation "
        "site, the peak, and what was alive then. Hover an area for its site, shapes and scope."
    ),
    new_code_cell("%tidyjax timeline on"),
    new_code_cell(
        "%%tidy\n"
        "big = [tj.numpy.ones((256, 256)) * i for i in range(4)]\n"
        "total = sum(b.sum() for b in big)\n"
        "float(total)"
    ),
    new_code_cell("%tidyjax timeline off\n%tidyjax timeline"),
    new_markdown_cell("## `memory()`"),
    new_code_cell(
        "tj.dispose([leaky, info.result, final, result, out, x, h, g, big, total])\n"
        "tj.dispose_variables()\n"
        "%tidyjax memory"
    ),
]

TRAINING = [
    new_markdown_cell(
        "# A training loop, with and without `tidy`\n\n"
        "The same linear-regression step runs 150 times twice. Without `tidy`, each step's "
        "intermediates stay alive, because a list keeps them as notebooks and logging lists do. "
        "With each step under `tidy`, they are freed when the step ends, and memory stays flat."
    ),
    new_code_cell(
        "%matplotlib inline\n"
        "import numpy as np\n"
        "import matplotlib.pyplot as plt\n"
        "import tidyjax as tj\n"
        "from tidyjax import tidy\n\n"
        "rng = np.random.default_rng(0)\n"
        "x = tj.tensor(rng.normal(size=(256, 16)).astype(np.float32))\n"
        "y = x @ tj.tensor(rng.normal(size=(16, 1)).astype(np.float32))\n"
        "STEPS = 150"
    ),
    new_code_cell(
        "def step(w, log):\n"
        "    pred = x @ w\n"
        "    err = pred - y\n"
        "    grad = (x.T @ err) * (2.0 / err.size)\n"
        "    log.append((pred, err, grad))   # lingering references\n"
        "    w.assign(w - 0.05 * grad)\n"
        "    return (err * err).mean()\n\n"
        "def run(use_tidy):\n"
        '    w = tj.Variable(np.zeros((16, 1), np.float32), name="w")\n'
        "    log, sizes, losses = [], [], []\n"
        "    for _ in range(STEPS):\n"
        "        if use_tidy:\n"
        "            loss = tidy.run(step, w, log)\n"
        "        else:\n"
        "            loss = step(w, log)\n"
        "        losses.append(loss.item())\n"
        "        loss.dispose()\n"
        "        sizes.append(tj.memory().num_bytes)\n"
        "    tj.dispose([log, w])\n"
        "    return sizes, losses\n\n"
        "without, loss_without = run(use_tidy=False)\n"
        "with_tidy, loss_with = run(use_tidy=True)\n"
        'print(f"without tidy: {without[0]} -> {without[-1]} bytes")\n'
        'print(f"with tidy:    {with_tidy[0]} -> {with_tidy[-1]} bytes (flat: {len(set(with_tidy)) == 1})")\n'
        'print(f"same losses: {np.allclose(loss_without, loss_with)}, final loss {loss_with[-1]:.5f}")'
    ),
    new_code_cell(
        "fig, ax = plt.subplots(figsize=(6, 3))\n"
        'ax.plot(without, label="without tidy")\n'
        'ax.plot(with_tidy, label="each step under tidy")\n'
        'ax.set_xlabel("step"); ax.set_ylabel("tidyjax bytes alive"); ax.legend()\n'
        "plt.show()"
    ),
    new_markdown_cell(
        "## The same two runs as a timeline\n\n"
        "`tj.timeline()` records every allocation and free. Without `tidy` the step's "
        "intermediates pile up until the run ends; with it, each step's are freed as it ends. "
        "Hover an area for its creation site; the table lists what was alive at the peak."
    ),
    new_code_cell(
        "STEPS = 40\n"
        "with tj.timeline() as tl:\n"
        '    with tidy("without tidy"):\n'
        "        run(use_tidy=False)\n"
        '    with tidy("with tidy"):\n'
        "        run(use_tidy=True)\n"
        "tl"
    ),
    new_code_cell("tj.dispose([x, y])\ntj.memory()"),
]


# The same training cell, run several times in a row, as a notebook user re-runs a cell.
RUNS = 4
TRAIN_CELL = (
    "sizes.append(device_bytes())   # before this run\n"
    "for _ in range(20):\n"
    "    params, opt_state, loss = step(params, opt_state)\n"
    'print(f"run {len(sizes)}: loss {float(loss):.4f}, device bytes at its start {mib(sizes[-1])}")\n'
    'params["w"], loss   # shown: Out[] and _ now refer to these arrays'
)

PLAIN_JAX = [
    new_markdown_cell(
        "# Plain JAX in a notebook: what `Out[]` keeps alive\n\n"
        "Nothing here uses tidyjax Tensors: a plain `jax`/`optax` training cell, run four times "
        "in a row. Each run ends by showing the weights and the loss, so IPython's output "
        "history (`Out[n]`, `_`, `__`) keeps a reference to that run's arrays. When the next run "
        "rebinds `params`, the old arrays stay alive through `Out[]`, and device memory grows "
        "run after run.\n\n"
        "With the extension (`%%tidy` on a cell, or `%tidyjax auto on` for every cell), the "
        "arrays a cell made or rebound that *only* the output history or a traceback still "
        "holds are deleted when the cell ends, and their `Out[n]` entry becomes a short "
        "placeholder. What any of your names reaches is never touched."
    ),
    new_code_cell(
        "import jax\n"
        "import jax.numpy as jnp\n"
        "import optax\n\n"
        "kx, kw = jax.random.split(jax.random.key(0))\n"
        "X = jax.random.normal(kx, (512, 1024))\n"
        "Y = X @ (jax.random.normal(kw, (1024, 256)) / 32)\n"
        "opt = optax.adam(1e-2)\n\n"
        "def init():\n"
        '    params = {"w": jnp.zeros((1024, 256)), "b": jnp.zeros((256,))}   # 1 MiB\n'
        "    return params, opt.init(params)\n\n"
        "def loss_fn(params):\n"
        '    return jnp.mean((X @ params["w"] + params["b"] - Y) ** 2)\n\n'
        "@jax.jit\n"
        "def step(params, opt_state):\n"
        "    loss, grads = jax.value_and_grad(loss_fn)(params)\n"
        "    updates, opt_state = opt.update(grads, opt_state)\n"
        "    return optax.apply_updates(params, updates), opt_state, loss\n\n"
        "def device_bytes():\n"
        '    """Bytes of every jax array alive, each buffer once (a shown array keeps a view)."""\n'
        "    return sum({a.unsafe_buffer_pointer(): a.nbytes for a in jax.live_arrays()}.values())\n\n"
        "def mib(n):\n"
        '    return f"{n / 2**20:.1f} MiB"\n\n'
        "def report(label, sizes):\n"
        "    growth = sizes[-1] - sizes[0]\n"
        '    trend = f"flat: {growth == 0}" if growth == 0 else f"growing: {growth > 0}"\n'
        "    print(f\"{label}: {' -> '.join(mib(s) for s in sizes)} ({trend})\")"
    ),
    new_markdown_cell("## Without the extension"),
    new_code_cell("params, opt_state = init()\nsizes = []"),
    *[new_code_cell(TRAIN_CELL) for _ in range(RUNS)],
    new_code_cell('without = sizes\nreport("without tidyjax", without)'),
    new_markdown_cell(
        "`%reset -f out` empties the output history, which is all that still held the old "
        "arrays: their memory comes back."
    ),
    new_code_cell(
        "before = device_bytes()\n"
        "%reset -f out\n"
        'print(f"device bytes: {mib(before)} -> {mib(device_bytes())}")'
    ),
    new_markdown_cell(
        "## `%%tidy` on the cell\n\n"
        "The same cell under `%%tidy`. Each run ends by freeing the previous run's weights and "
        "loss, which only `Out[]` still held, and says so."
    ),
    new_code_cell("%load_ext tidyjax\nparams, opt_state = init()\nsizes = []"),
    *[new_code_cell("%%tidy\n" + TRAIN_CELL) for _ in range(RUNS)],
    new_code_cell('with_tidy = sizes\nreport("with %%tidy", with_tidy)'),
    new_markdown_cell(
        "What the output history holds now: each earlier run's entry is a placeholder, the last "
        "run's weights are still there (the name `params` holds them too)."
    ),
    new_code_cell('for n in sorted(Out):\n    print(f"Out[{n}]: {Out[n]!r:.90}")'),
    new_markdown_cell(
        "## `%tidyjax auto on`\n\n"
        "The same for every cell, with nothing added to the cells themselves."
    ),
    new_code_cell("%tidyjax auto on"),
    new_code_cell("params, opt_state = init()\nsizes = []"),
    *[new_code_cell(TRAIN_CELL) for _ in range(RUNS)],
    new_code_cell('with_auto = sizes\nreport("with auto mode", with_auto)\n%tidyjax auto off'),
]


def build(name: str, cells: list) -> pathlib.Path:
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(HERE)}}
    ).execute()
    path = HERE / name
    nbformat.write(nb, path)
    return path


NOTEBOOKS = {
    "quickstart.ipynb": QUICKSTART,
    "training_loop.ipynb": TRAINING,
    "plain_jax.ipynb": PLAIN_JAX,
}


def main(names: list[str]) -> None:
    """Build the notebooks named (all of them when none is)."""
    for name in names or NOTEBOOKS:
        print("wrote", build(name, NOTEBOOKS[name]))


if __name__ == "__main__":
    main(sys.argv[1:])
