"""Write the notebooks and execute them in a real kernel, saving their outputs.

Run:  pip install -e ".[notebooks]" && python notebooks/build.py

The committed .ipynb files are this script's output; tests/test_notebooks.py runs them again.
"""

from __future__ import annotations

import pathlib

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
    new_markdown_cell("## `memory()`"),
    new_code_cell(
        "tj.dispose([leaky, info.result, final, result, out, x, h, g])\n"
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
    new_code_cell("tj.dispose([x, y])\ntj.memory()"),
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


def main() -> None:
    for name, cells in (("quickstart.ipynb", QUICKSTART), ("training_loop.ipynb", TRAINING)):
        print("wrote", build(name, cells))


if __name__ == "__main__":
    main()
