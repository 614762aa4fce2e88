"""What a ``with check_leaks()`` block lists apart instead of counting (issue 41, items 3 and 4):
a Tensor or array only the block's local names hold (the last batch of a loop: the block's
result, as a decorated function's return value is; module globals at top level), and an array
only NumPy views hold (``np.asarray`` of a CPU array shares its buffer). Anything else that
also holds one (a list, a global, a closure) makes it count as before."""

from __future__ import annotations

import gc
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import tidyjax as tj

OPT = optax.sgd(0.1)
GLOBAL_CACHE: list = []

on_cpu = pytest.mark.skipif(
    jax.default_backend() != "cpu", reason="np.asarray shares the buffer on CPU only"
)


@jax.jit
def _step(params, opt_state, x, labels):
    def loss_fn(p):
        return optax.softmax_cross_entropy_with_integer_labels(x @ p, labels).mean()

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = OPT.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


def _batches(n):
    for i in range(n):
        yield jnp.full((8, 4), float(i)), jnp.arange(8) % 3


def fit(steps, **options):
    """optax's getting-started loop: ``for x, labels in batches`` leaves the last batch (and
    the last loss) bound to local names of ``fit`` after the loop."""
    params = jnp.zeros((4, 3))
    opt_state = OPT.init(params)
    params, opt_state, _ = _step(params, opt_state, *next(_batches(1)))  # warm-up
    with tj.check_leaks(**options) as checker:
        for x, labels in _batches(steps):
            params, opt_state, loss = _step(params, opt_state, x, labels)  # noqa: RUF059 - left bound
        checker.allow(params, opt_state)
    return checker.report


def test_the_last_batch_bound_by_a_loop_is_listed_by_name_not_counted():
    report = fit(5)
    assert report is not None and len(report) == 0 and report.num_bytes == 0
    assert [names for names, _ in report.bound_locals] == ["x", "labels", "loss"]
    assert [r.shape for _, r in report.bound_locals] == [(8, 4), (8,), ()]
    assert report.bound_in == "fit" and report.numpy_views == ()
    text = str(report)
    assert text.startswith("no leaks: ")
    assert "3 untracked arrays (164 B) still bound to `x` float32[8, 4], `labels` int32[8]" in text
    assert "in `fit`: the block's result" in text and "count_locals=True" in text
    assert "`labels`" in report._repr_html_() and "'labels'" in repr(report)


def test_count_locals_counts_the_names_bound_at_the_end():
    with pytest.raises(tj.LeakError) as err:
        fit(5, count_locals=True)
    report = err.value.report
    assert len(report) == 3 and len(report.arrays) == 3 and report.bound_locals == ()
    assert str(err.value).startswith("3 untracked arrays (164 B) created inside check_leaks()")


def test_an_array_appended_to_a_list_made_before_the_block_is_a_leak():
    cache = []
    with pytest.raises(tj.LeakError) as err, tj.check_leaks():
        for i in range(3):
            out = jnp.ones(4) * i
            cache.append(out)  # the last one is also bound to `out`: the list holds it too
    report = err.value.report
    assert len(report) == 3 and report.num_bytes == 3 * 16
    assert report.bound_locals == () and report.numpy_views == ()
    assert "still bound" not in str(err.value)
    del cache, out


def test_an_array_bound_to_a_local_and_in_a_global_list_is_a_leak():
    with pytest.raises(tj.LeakError) as err, tj.check_leaks():
        out = jnp.ones(4) + 1
        GLOBAL_CACHE.append(out)
    assert len(err.value.report) == 1 and err.value.report.bound_locals == ()
    GLOBAL_CACHE.clear()
    del out


def test_arrays_in_a_list_bound_to_a_local_name_count():
    """A name holding a list holds the list; each array in it counts as before."""
    with pytest.raises(tj.LeakError) as err, tj.check_leaks():
        outs = [jnp.ones(4) * i for i in range(3)]
        pair = (jnp.ones(2) + 1, 1)
    assert len(err.value.report) == 4 and err.value.report.bound_locals == ()
    del outs, pair


def test_an_array_a_closure_sees_counts():
    with pytest.raises(tj.LeakError) as err, tj.check_leaks():
        seen = jnp.ones(4) + 1

        def later():
            return seen

    assert len(err.value.report) == 1 and err.value.report.bound_locals == ()
    assert later() is seen


def test_a_tensor_bound_to_a_local_name_is_listed_not_counted():
    with tj.check_leaks() as checker:
        t = tj.tensor([1.0, 2.0])
    report = checker.report
    assert report is not None and len(report) == 0
    ((names, record),) = report.bound_locals
    assert names == "t" and record.id == t._id
    assert "1 tensor (8 B) still bound to `t` float32[2] in " in str(report)
    with pytest.raises(tj.LeakError, match="1 tensor"), tj.check_leaks(count_locals=True):
        t2 = tj.tensor([1.0])
    tj.dispose([t, t2])


def test_one_array_under_two_names_is_listed_once():
    with tj.check_leaks() as checker:
        a = jnp.ones(3) + 1
        b = a
    assert checker.report is not None and len(checker.report) == 0
    assert [n for n, _ in checker.report.bound_locals] == ["a, b"]
    del a, b


def _printed(read, hold=None, **options):
    """The MNIST examples' epoch end: accuracies computed in the block, read (printed), left
    bound to local names; ``hold`` also holds something made from one."""
    x = jnp.arange(6.0)
    jnp.mean(x)  # warm-up
    with tj.check_leaks(**options) as checker:
        train_acc = jnp.mean(x)
        test_acc = jnp.mean(x * 2)
        read(train_acc)
        read(test_acc)
        if hold is not None:
            hold(test_acc)
    return checker.report


READS = {
    "f-string": lambda a: print(f"accuracy {a}"),
    "repr": repr,
    "tolist": lambda a: a.tolist(),
    "item": lambda a: a.item(),
}


@pytest.mark.parametrize("read", list(READS))
def test_a_local_read_after_the_loop_is_listed_by_name_not_counted(read, capsys):
    """Reading an array's value makes JAX cache a view of its buffer on it (a new jax.Array
    held by the array alone): the view goes with its owner, listed by the owner's name."""
    report = _printed(READS[read])
    assert report is not None and len(report) == 0, str(report)
    assert [n for n, _ in report.bound_locals] == ["train_acc", "test_acc"]
    with pytest.raises(tj.LeakError) as err:
        _printed(READS[read], count_locals=True)
    assert len(err.value.report) == 2  # one a buffer, however many objects view it


def test_a_read_local_also_in_a_list_or_viewed_again_by_a_list_counts(capsys):
    cache: list = []
    with pytest.raises(tj.LeakError) as err:
        _printed(READS["f-string"], cache.append)
    assert len(err.value.report) == 1 and err.value.report.arrays[0].shape == ()
    assert [n for n, _ in err.value.report.bound_locals] == ["train_acc"]
    cache.clear()
    # another object over the local's buffer (a transfer to where it is), held by a list
    with pytest.raises(tj.LeakError) as err:
        _printed(READS["f-string"], lambda a: cache.append(jax.device_put(a, a.device)))
    assert len(err.value.report) == 1
    assert [n for n, _ in err.value.report.bound_locals] == ["train_acc"]
    cache.clear()


def test_the_check_lets_go_of_the_frame_and_its_names():
    """Reading the names keeps nothing: rebinding one after the block frees its array."""
    with tj.check_leaks() as checker:
        y = jnp.ones(3) + 1
    assert checker.report is not None and [n for n, _ in checker.report.bound_locals] == ["y"]
    ref = weakref.ref(y)
    y = None
    gc.collect()
    assert ref() is None and y is None


SCRIPT = """
import jax.numpy as jnp
import tidyjax as tj

kept = []
with tj.check_leaks(**OPTIONS) as checker:
    for i in range(3):
        y = jnp.ones(5) * i
        total = jnp.sum(y)
report = checker.report
"""


def test_at_top_level_the_module_globals_are_the_local_names(tmp_path):
    code = compile(SCRIPT, str(tmp_path / "script.py"), "exec")
    namespace: dict = {"__name__": "script", "OPTIONS": {}}
    exec(code, namespace)
    report = namespace["report"]
    assert len(report) == 0 and report.bound_in == "<module>"
    assert sorted(n for n, _ in report.bound_locals) == ["total", "y"]
    assert "still bound to `y` float32[5], `total` float32[] in `<module>`" in str(report)
    namespace = {"__name__": "script", "OPTIONS": {"count_locals": True}}
    with pytest.raises(tj.LeakError) as err:
        exec(code, namespace)
    assert len(err.value.report) == 2 and err.value.report.bound_locals == ()
    leaky = SCRIPT.replace("total = jnp.sum(y)", "total = jnp.sum(y)\n        kept.append(y)")
    namespace = {"__name__": "script", "OPTIONS": {}}
    with pytest.raises(tj.LeakError) as err:
        exec(compile(leaky, str(tmp_path / "leaky.py"), "exec"), namespace)
    assert len(err.value.report) == 3  # the list holds each y: the last one too
    assert [n for n, _ in err.value.report.bound_locals] == ["total"]


@jax.jit
def _loss(x):
    return (x**2).mean()


def train(steps, keep, **options):
    losses = []
    _loss(jnp.ones(3))  # warm-up
    with tj.check_leaks(**options) as checker:
        for i in range(steps):
            loss = _loss(jnp.full(3, float(i)))
            losses.append(keep(loss))
    return checker.report, losses


@on_cpu
@pytest.mark.parametrize("steps", [6, 40])  # up to 16 and more: two ways of finding the views
def test_arrays_held_by_numpy_views_are_listed_with_the_fix_not_counted(steps):
    report, losses = train(steps, np.asarray)
    assert len(report) == 0 and report.bound_locals == ()  # the last `loss` too: a view holds it
    assert len(report.numpy_views) == steps and all(r.shape == () for r in report.numpy_views)
    text = str(report)
    assert f"{steps} untracked arrays ({4 * steps} B) held by NumPy views" in text
    assert "np.array(x), float(x) or x.item()" in text and "count_numpy_views=True" in text
    assert "held by NumPy views" in report._repr_html_()
    assert f"numpy_views={steps}" in repr(report)
    assert [float(v) for v in losses] == [float(i * i) for i in range(steps)]


@on_cpu
def test_count_numpy_views_counts_them():
    with pytest.raises(tj.LeakError) as err:
        train(6, np.asarray, count_numpy_views=True)
    report = err.value.report
    assert len(report) == 6 and report.numpy_views == ()
    assert str(err.value).startswith("6 untracked arrays (24 B) created inside check_leaks()")


@on_cpu
def test_an_array_held_by_a_view_and_a_list_is_a_leak():
    kept = []
    with pytest.raises(tj.LeakError) as err, tj.check_leaks():
        out = jnp.ones(4) + 1
        kept.append(out)
        view = np.asarray(out)
        del out
    assert len(err.value.report) == 1 and err.value.report.numpy_views == ()
    del kept, view


@pytest.mark.parametrize(
    "keep", [float, np.array, lambda x: x.item()], ids=["float", "copy", "item"]
)
def test_a_copy_of_each_loss_leaves_no_finding(keep):
    losses = []
    with tj.check_leaks() as checker:
        for i in range(4):
            losses.append(keep(_loss(jnp.full(3, float(i)))))
    report = checker.report
    assert report is not None and len(report) == 0
    assert report.bound_locals == () and report.numpy_views == ()
    assert str(report) == (
        "no leaks: no Tensor or jax array created inside check_leaks() is still alive."
    )
    assert [float(v) for v in losses] == [float(i * i) for i in range(4)]
