"""Ragged batching's pure parts (workers/batch_io.py): every batch_input kind Triton's
backends generate, and the BATCH_SCATTER_WITH_INPUT_SHAPE scatter, with exact arrays.
Shapes are the requests' source-input shapes, batch dimension first."""

import numpy as np
import pytest

from shm.errors import InferError
from workers import batch_io

# three requests: batch 1 of 3 elements, batch 2 of 4 each, batch 1 of 5
SHAPES = [(1, 3), (2, 4), (1, 5)]


def test_element_count_counts_each_requests_whole_tensor():
    """BATCH_ELEMENT_COUNT: [requests], each request's element count, batch dim
    included (a batch-2 request of 4 counts 8)."""
    out = batch_io.generate("BATCH_ELEMENT_COUNT", "INT32", SHAPES)
    assert out.dtype == np.int32 and out.shape == (3,)
    np.testing.assert_array_equal(out, [3, 8, 5])


def test_accumulated_element_count_marks_where_each_request_ends():
    """BATCH_ACCUMULATED_ELEMENT_COUNT: the running sum (the ragged doc's [3, 7, 12])."""
    out = batch_io.generate("BATCH_ACCUMULATED_ELEMENT_COUNT", "INT32",
                            [(1, 3), (1, 4), (1, 5)])
    np.testing.assert_array_equal(out, [3, 7, 12])
    out = batch_io.generate("BATCH_ACCUMULATED_ELEMENT_COUNT", "FP32", SHAPES)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [3.0, 11.0, 16.0])


def test_accumulated_element_count_with_zero_has_one_more_entry():
    """BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO: [requests + 1], starting at 0."""
    out = batch_io.generate("BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO", "INT32", SHAPES)
    assert out.shape == (4,)
    np.testing.assert_array_equal(out, [0, 3, 11, 16])


def test_max_element_count_is_carried_by_the_shape():
    """BATCH_MAX_ELEMENT_COUNT_AS_SHAPE: shape [max element count], in the data type."""
    out = batch_io.generate("BATCH_MAX_ELEMENT_COUNT_AS_SHAPE", "FP32", SHAPES)
    assert out.shape == (8,) and out.dtype == np.float32
    out = batch_io.generate("BATCH_MAX_ELEMENT_COUNT_AS_SHAPE", "INT32", [(1, 2), (1, 6)])
    assert out.shape == (6,) and out.dtype == np.int32


def test_item_shape_has_a_row_per_batch_item():
    """BATCH_ITEM_SHAPE: [batch items, rank - 1]; a batch-2 request gives two rows
    (model_config.proto's example: [3, 1] batch-2 and [2, 2] batch-1 inputs give
    [[3, 1], [3, 1], [2, 2]])."""
    out = batch_io.generate("BATCH_ITEM_SHAPE", "INT32", [(2, 3, 1), (1, 2, 2)])
    assert out.shape == (3, 2) and out.dtype == np.int32
    np.testing.assert_array_equal(out, [[3, 1], [3, 1], [2, 2]])
    out = batch_io.generate("BATCH_ITEM_SHAPE", "FP32", SHAPES)
    np.testing.assert_array_equal(out, [[3.0], [4.0], [4.0], [5.0]])


def test_item_shape_flatten_is_the_same_values_in_one_dimension():
    """BATCH_ITEM_SHAPE_FLATTEN: BATCH_ITEM_SHAPE's values as a 1-D tensor."""
    out = batch_io.generate("BATCH_ITEM_SHAPE_FLATTEN", "INT32", [(2, 3, 1), (1, 2, 2)])
    assert out.shape == (6,)
    np.testing.assert_array_equal(out, [3, 1, 3, 1, 2, 2])


def test_item_shape_needs_one_rank():
    """Items of different ranks cannot make one [items, rank - 1] tensor."""
    with pytest.raises(InferError, match="one rank"):
        batch_io.generate("BATCH_ITEM_SHAPE", "INT32", [(1, 3), (1, 2, 2)])


def test_scatter_gives_each_request_its_elements_in_its_source_shape():
    """BATCH_SCATTER_WITH_INPUT_SHAPE: request i gets the next num_elements(shape_i)
    elements of the model's output, viewed in shape_i, whatever the output's shape."""
    out = np.arange(16, dtype=np.float32).reshape(16, 1)
    parts = batch_io.scatter(out, SHAPES, "OUT")
    assert [p.shape for p in parts] == SHAPES
    np.testing.assert_array_equal(parts[0], [[0, 1, 2]])
    np.testing.assert_array_equal(parts[1], [[3, 4, 5, 6], [7, 8, 9, 10]])
    np.testing.assert_array_equal(parts[2], [[11, 12, 13, 14, 15]])
    assert all(np.shares_memory(p, out) for p in parts)  # views: written once, later


def test_scatter_refuses_an_output_of_the_wrong_size():
    """An output that does not hold every request's elements is an error, not a
    silent truncation."""
    with pytest.raises(InferError, match="15 elements"):
        batch_io.scatter(np.zeros(15, np.float32), SHAPES, "OUT")


def test_config_entries_are_read_with_protos_defaults():
    """batch_input/batch_output as the worker's JSON config has them; kind 0
    (BATCH_ELEMENT_COUNT, BATCH_SCATTER_WITH_INPUT_SHAPE) is the default."""
    config = {
        "input": [{"name": "X", "allow_ragged_batch": True}, {"name": "Y"}],
        "batch_input": [
            {"target_name": ["N", "N2"], "data_type": "TYPE_INT32", "source_input": ["X"]},
            {"kind": "BATCH_ITEM_SHAPE", "target_name": ["S"], "data_type": "TYPE_FP32",
             "source_input": ["X"]}],
        "batch_output": [{"target_name": ["A", "B"], "source_input": ["X"]}],
    }
    assert batch_io.ragged_inputs(config) == {"X"}
    assert batch_io.batch_inputs(config) == [
        batch_io.BatchInput("BATCH_ELEMENT_COUNT", ("N", "N2"), "INT32", "X"),
        batch_io.BatchInput("BATCH_ITEM_SHAPE", ("S",), "FP32", "X")]
    outputs = batch_io.batch_outputs(config)
    assert set(outputs) == {"A", "B"}
    assert outputs["A"].kind == "BATCH_SCATTER_WITH_INPUT_SHAPE" and outputs["A"].source == "X"


@pytest.mark.parametrize("entry, reason", [
    ({"target_name": ["N"], "data_type": "TYPE_INT64", "source_input": ["X"]},
     "TYPE_INT32 or TYPE_FP32"),
    ({"target_name": ["N"], "data_type": "TYPE_INT32", "source_input": []},
     "expects 1 source input, got 0"),
])
def test_bad_batch_inputs_are_load_errors(entry, reason):
    """Triton's ValidateBatchIO reasons, raised when an instance loads."""
    with pytest.raises(ValueError, match=reason):
        batch_io.batch_inputs({"batch_input": [entry]})
