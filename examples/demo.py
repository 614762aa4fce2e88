"""A training-style loop that makes many intermediates per step, each step under tidy.

Run:  python examples/demo.py

Prints memory() every few steps: with tidy the count stays flat; the same loop without tidy,
keeping a reference per step as notebooks and logging lists do, grows without bound.
"""

from __future__ import annotations

import tidyjax as tj
from tidyjax import tidy

STEPS = 60


def main() -> None:
    key = tj.tensor([[0.5, -0.2, 0.1], [0.3, 0.8, -0.5]])
    x = tj.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]])
    y = tj.tensor([[1.0, 0.0, 0.5], [0.0, 1.0, 0.5], [1.0, 1.0, 0.0], [0.5, 0.5, 0.5]])
    w = tj.Variable(key, name="w")  # shares key's buffer; never freed by a scope
    lr = 0.002

    @tidy("step")
    def step() -> tj.Tensor:
        pred = x @ w  # every line makes new device buffers
        err = pred - y
        loss = (err * err).mean()
        grad = (x.T @ err) * (2.0 / err.size)
        w.assign(w - lr * grad)  # the new value survives the scope inside the Variable
        return loss  # the only intermediate that leaves the step

    history = []  # lingering references, like a notebook's Out[] or a logging list
    print(f"{'step':>5} {'loss':>8} {'tensors':>8} {'buffers':>8} {'bytes':>8}")
    for i in range(1, STEPS + 1):
        loss = step()
        history.append(loss)
        if len(history) > 1:
            history.pop(0).dispose()  # we only keep the latest loss
        if i % 10 == 0:
            m = tj.memory()
            print(f"{i:5d} {loss.item():8.4f} {m.num_tensors:8d} {m.num_data_buffers:8d} "
                  f"{m.num_bytes:8d}")  # fmt: skip

    print("\nthe same loop without tidy, keeping each step's loss in a list:")
    leaked = []
    for i in range(1, 31):
        pred = x @ w
        err = pred - y
        leaked.append(((err * err).mean(), pred, err))  # references linger
        if i % 10 == 0:
            m = tj.memory()
            print(f"{i:5d} {'':8s} {m.num_tensors:8d} {m.num_data_buffers:8d} {m.num_bytes:8d}")
    tj.dispose([leaked, history, x, y, key])
    tj.dispose_variables()
    print("\nafter dispose:", tj.memory())


if __name__ == "__main__":
    main()
