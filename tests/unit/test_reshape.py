"""Config `reshape` (workers/batch_io.py): request shapes in `dims` reach the model in
`reshape.shape`, model outputs come back in `dims`."""

import numpy as np

from workers.batch_io import Reshaper, reshaped


def test_fixed_shapes_map_directly():
    """Rule: with no variable dimension the target shape is the reshape as written,
    and [1] -> [] (Triton's idiom for a batched scalar) gives the batch alone."""
    assert reshaped((4,), (4,), (2, 2)) == (2, 2)
    assert reshaped((1,), (1,), ()) == ()


def test_variable_dimensions_carry_over_in_order():
    """Rule: the k-th -1 of the target takes the k-th variable size of the source."""
    assert reshaped((3, 5, 2), (-1, -1, 2), (-1, 2, -1)) == (3, 2, 5)
    # one free size the element count fixes, when the ranks do not line up
    assert reshaped((6, 4), (-1,), (-1, 2)) == (12, 2)
    assert reshaped((5,), (-1,), (-1, -1)) is None  # cannot be mapped: left as it is


def test_reshaper_keeps_batch_dimension_and_goes_both_ways():
    config = {"max_batch_size": 8,
              "input": [{"name": "I", "dims": [4], "reshape": {"shape": [2, 2]}},
                        {"name": "J", "dims": [4]}],
              "output": [{"name": "O", "dims": [-1], "reshape": {"shape": [-1, 2]}}]}
    r = Reshaper(config)
    assert r
    assert r.input("I", np.zeros((3, 4))).shape == (3, 2, 2)
    assert r.input("J", np.zeros((3, 4))).shape == (3, 4)  # no reshape: untouched
    assert r.output("O", np.zeros((3, 5, 2))).shape == (3, 10)
    assert not Reshaper({"input": [{"name": "I", "dims": [4]}]})


def test_reshaper_without_batching():
    r = Reshaper({"input": [{"name": "I", "dims": [2, 3], "reshape": {"shape": [6]}}]})
    assert r.input("I", np.arange(6).reshape(2, 3)).tolist() == [0, 1, 2, 3, 4, 5]
