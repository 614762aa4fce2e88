"""The seed document's three TensorFlow.js examples, as tidyjax code, with their counts."""

from __future__ import annotations

import numpy as np

import tidyjax as tj
from tidyjax import tidy


def test_three_tensors_after_add_and_dispose_frees_c():
    a = tj.tensor([1, 2, 3, 4])
    b = tj.tensor([5, 6, 7, 8])
    c = a.add(b)
    assert tj.memory().num_tensors == 3
    assert tj.memory().num_data_buffers == 3
    np.testing.assert_array_equal(c.numpy(), [6, 8, 10, 12])
    c_array = c.array
    c.dispose()
    assert c.is_disposed and c_array.is_deleted()
    assert tj.memory().num_tensors == 2
    tj.dispose([a, b, c])  # the seed's tf.dispose([a, b, c]); c twice is fine
    assert tj.memory().num_tensors == 0


def test_tidy_frees_x_and_y_and_keeps_the_result():
    seen = {}

    def body():
        x = tj.tensor([1, 2, 3, 4])
        y = tj.tensor([5, 6, 7, 8])
        seen.update(x=x, y=y, arrays=(x.array, y.array))
        return x.add(y)

    result = tidy.run(body)
    assert seen["x"].is_disposed and seen["y"].is_disposed
    assert all(a.is_deleted() for a in seen["arrays"])
    np.testing.assert_array_equal(result.numpy(), [6, 8, 10, 12])
    assert tj.memory().num_tensors == 1
    result.dispose()


def test_nested_tidy_frees_b_at_the_inner_exit():
    seen = {}

    def outer():
        a = tj.tensor([1, 2, 3])

        def inner():
            b = tj.tensor([4, 5, 6])
            seen["b"] = b
            return a.mul(b)

        inner_result = tidy.run(inner)
        # b is gone as soon as the inner tidy ends; a and innerResult are alive.
        assert seen["b"].is_disposed
        assert not a.is_disposed and not inner_result.is_disposed
        assert tj.memory().num_tensors == 2
        seen["inner_result"] = inner_result
        return inner_result.add(a)

    final = tidy.run(outer)
    np.testing.assert_array_equal(final.numpy(), [5, 12, 21])
    assert seen["inner_result"].is_disposed
    assert tj.memory().num_tensors == 1
    final.dispose()
    assert tj.memory().num_tensors == 0
