"""Every notebook runs top to bottom in a real kernel (nbclient), with the outputs it shows."""

from __future__ import annotations

import pathlib

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOKS = pathlib.Path(__file__).resolve().parent.parent / "notebooks"


def execute(name: str):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []  # run afresh, not the committed outputs
    client = nbclient.NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}
    )
    client.execute()  # raises CellExecutionError on any failing cell
    return nb


def text_of(nb) -> str:
    parts = []
    for cell in nb.cells:
        stdout = []  # a busy kernel may send one print() as several stream messages
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                (stdout if out.get("name") == "stdout" else parts).append(out.get("text", ""))
                continue
            parts.append(out.get("data", {}).get("text/plain", ""))
            parts.append(out.get("data", {}).get("text/html", ""))
        parts.append("".join(stdout))
    return "\n".join(parts)


def test_quickstart_notebook():
    nb = execute("quickstart.ipynb")
    out = text_of(nb)
    for expected in [
        "after a.add(b): 3 tensors",
        "after c.dispose(): 2 tensors",
        "x, y disposed: [True, True]",
        "b disposed after the inner tidy: True",
        "losses: [1.0, 0.25, 0.0625]",
        "it was freed when scope 'block' exited",
        "tidy: freed 1 buffer (4 B); kept 2",
        "h, g alive: True True | _ disposed: True",
        "net change +12 B, +1 tensor",
        "created inside check_leaks() is still alive",
        "0 tensors, 0 buffers, 0 B",
    ]:
        assert expected in out, expected
    assert "<table" in out  # rich displays rendered as HTML
    # creation sites name cells as IPython does, not by the kernel's temporary cell files
    assert "In[" in out and "ipykernel_" not in out


def test_training_loop_notebook_is_flat_under_tidy_and_plots():
    nb = execute("training_loop.ipynb")
    out = text_of(nb)
    assert "(flat: True)" in out and "same losses: True" in out
    assert any("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))


def test_plain_jax_notebook_grows_without_the_extension_and_is_flat_with_it():
    pytest.importorskip("optax")
    nb = execute("plain_jax.ipynb")
    out = text_of(nb)
    assert "without tidyjax: 5.5 MiB -> 5.5 MiB -> 6.5 MiB -> 7.5 MiB (growing: True)" in out
    assert "with %%tidy: 5.5 MiB -> 5.5 MiB -> 5.5 MiB -> 5.5 MiB (flat: True)" in out
    assert "with auto mode: 5.5 MiB -> 5.5 MiB -> 5.5 MiB -> 5.5 MiB (flat: True)" in out
    assert out.count("tidy: freed 2 jax arrays (1.0 MiB)") == 3  # the previous run's w and loss
    assert "jax arrays deleted by tidyjax, held only by the output history" in out


def test_committed_notebooks_carry_outputs_from_a_real_run():
    for name in ("quickstart.ipynb", "training_loop.ipynb", "plain_jax.ipynb"):
        nb = nbformat.read(NOTEBOOKS / name, as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert all(c.execution_count for c in code), name
        assert not any(o.output_type == "error" for c in code for o in c.outputs), name
