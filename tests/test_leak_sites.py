"""A leak's site is the outermost user frame inside the checked block; the user frames further
in (a model's ``__call__``) are its stack. Two lines calling one model are two sites."""

from __future__ import annotations

import os

import jax.numpy as jnp
import numpy as np
import pytest

import tidyjax as tj
from tidyjax._jaxdoors import BIND_CONVERSION
from tidyjax._sites import Site

from .conftest import line_of

HERE = os.path.relpath(__file__)
HERE = __file__ if HERE.startswith(os.pardir) else HERE


class Model:
    def __init__(self) -> None:
        self.w = tj.tensor(np.ones(4, np.float32))

    def __call__(self, x: tj.Tensor) -> tj.Tensor:
        return self.layer(x)  # SITE:call

    def layer(self, x: tj.Tensor) -> tj.Tensor:
        return x * self.w  # SITE:layer


class PlainModel:
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        return x * 2  # SITE:plain-model


def _model_frames() -> list[tuple[str, int]]:
    """The model's frames (file, line), innermost first, as a leak site's stack holds them."""
    return [(__file__, line_of("SITE:layer")), (__file__, line_of("SITE:call"))]


def _where(stack: tuple[Site, ...]) -> list[tuple[str, int]]:
    """A stack's frames as (file, line): the function is named by its qualified name on newer
    JAX and by its bare name on JAX 0.6 (its traceback reads ``co_name``)."""
    return [(s.file, s.line) for s in stack]


def test_two_lines_calling_one_model_leak_at_two_sites_with_the_model_as_their_stack():
    model, x = Model(), tj.tensor(np.ones(4, np.float32))
    monitor: list[tj.Tensor] = []
    with pytest.raises(tj.LeakError) as err, tj.check_leaks():
        monitor.append(model(x))  # SITE:first
        for _ in range(2):
            monitor.append(model(x))  # SITE:second
    report = err.value.report
    name = "test_two_lines_calling_one_model_leak_at_two_sites_with_the_model_as_their_stack"
    first, second = line_of("SITE:first"), line_of("SITE:second")
    assert {(str(g.site), g.count) for g in report.groups} == {
        (f"{HERE}:{first} in {name}", 1),
        (f"{HERE}:{second} in {name}", 2),
    }
    assert all(
        r.site is not None and _where(r.site.stack) == _model_frames() for r in report.tensors
    )
    text = str(report)
    call, layer = "__call__", "layer"
    if "Model.layer" in text:  # qualified names on newer JAX, bare ones on JAX 0.6
        call, layer = "Model.__call__", "Model.layer"
    # each chain of user frames a group of its own, outer to inner (issue 41)
    model_chain = (
        f"{HERE}:{line_of('SITE:call')} in {call} → {HERE}:{line_of('SITE:layer')} in {layer}"
    )
    assert f"{HERE}:{first} in {name} → {model_chain}: 1 tensor" in text
    assert f"{HERE}:{second} in {name} → {model_chain}: 2 tensors" in text
    assert "through " not in text and "→" in report._repr_html_()
    tj.dispose([*monitor, model.w, x])


def _check_here(model: Model, x: tj.Tensor, monitor: list[tj.Tensor]) -> None:
    with tj.check_leaks():
        monitor.append(model(x))  # SITE:helper


def _outer(model: Model, x: tj.Tensor, monitor: list[tj.Tensor]) -> None:
    _check_here(model, x, monitor)  # a user frame outside the checked block: never the site


def test_the_site_is_inside_the_checked_block_not_in_the_user_code_around_it():
    model, x = Model(), tj.tensor(np.ones(4, np.float32))
    monitor: list[tj.Tensor] = []
    with pytest.raises(tj.LeakError) as err:
        _outer(model, x, monitor)
    (record,) = err.value.report.tensors
    assert record.site is not None
    assert Site(record.site.file, record.site.line, record.site.function) == Site(
        __file__, line_of("SITE:helper"), "_check_here"
    )
    assert record.site is not None and _where(record.site.stack) == _model_frames()
    tj.dispose([*monitor, model.w, x])


@pytest.mark.skipif(
    not BIND_CONVERSION,
    reason="known gap: on JAX before 0.10.2 the decorator form names the caller's line, not the "
    "decorated function's; reported in the closing note",
)
def test_the_decorator_form_names_the_decorated_functions_line():
    model, x = Model(), tj.tensor(np.ones(4, np.float32))
    monitor: list[tj.Tensor] = []

    @tj.check_leaks()
    def step() -> None:
        monitor.append(model(x))  # SITE:decorated

    with pytest.raises(tj.LeakError) as err:
        step()
    (record,) = err.value.report.tensors
    name = "test_the_decorator_form_names_the_decorated_functions_line.<locals>.step"
    # the function is named by its qualified name on newer JAX, by its bare name on JAX 0.6
    assert record.site is not None and record.site.function in (name, name.split(".")[-1])
    assert (record.site.file, record.site.line) == (__file__, line_of("SITE:decorated"))
    tj.dispose([*monitor, model.w, x])


def test_plain_arrays_a_model_makes_are_at_the_users_call_too():
    model, x = PlainModel(), jnp.ones(4)
    monitor: list[jnp.ndarray] = []
    with pytest.raises(tj.LeakError) as err, tj.check_leaks():
        monitor.append(model(x))  # SITE:plain-first
        monitor.append(model(x))  # SITE:plain-second
    report = err.value.report
    name = "test_plain_arrays_a_model_makes_are_at_the_users_call_too"
    assert sorted(str(g.site) for g in report.array_groups) == [
        f"{HERE}:{line_of('SITE:plain-first')} in {name}",
        f"{HERE}:{line_of('SITE:plain-second')} in {name}",
    ]
    stack = [(__file__, line_of("SITE:plain-model"))]
    assert all(r.site is not None and _where(r.site.stack) == stack for r in report.arrays)
    monitor.clear()


def test_a_leak_made_on_the_blocks_own_line_has_no_stack():
    with pytest.raises(tj.LeakError) as err, tj.check_leaks(count_locals=True):
        t = tj.tensor([1.0])  # SITE:own
    (record,) = err.value.report.tensors
    assert record.site is not None and record.site.line == line_of("SITE:own")
    assert record.site.stack == ()
    assert "through" not in str(err.value)
    t.dispose()


def test_a_leak_sites_stack_survives_the_json_of_a_record():
    model, x = Model(), tj.tensor(np.ones(4, np.float32))
    monitor: list[tj.Tensor] = []
    with pytest.raises(tj.LeakError) as err, tj.check_leaks():
        monitor.append(model(x))
    (record,) = err.value.report.tensors
    again = type(record).from_json(record.to_json())
    assert again.site == record.site and again.site is not None
    assert again.site.stack == record.site.stack
    assert _where(record.site.stack) == _model_frames()
    tj.dispose([*monitor, model.w, x])
