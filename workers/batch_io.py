"""Ragged batching: Triton's `batch_input` tensors and `batch_output` scattering.

A ragged input (`allow_ragged_batch: true`) may differ in shape from request to request
in one batch. Framework backends receive it as Triton's onnxruntime and pytorch backends
pass it: every request's tensor flattened, batch dimension included, and concatenated
into one 1-D tensor. Because that tensor no longer says where each request starts, the
server generates `batch_input` tensors that describe the batch, from the shapes the
requests gave for the kind's `source_input` (model_config.proto `BatchInput`):

- BATCH_ELEMENT_COUNT: [requests], each request's element count;
- BATCH_ACCUMULATED_ELEMENT_COUNT: [requests], the running sum of those counts (where
  each request ends in the concatenation);
- BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO: [requests + 1], the same with a leading 0;
- BATCH_MAX_ELEMENT_COUNT_AS_SHAPE: [max element count]; the shape is the information
  (Triton leaves the data uninitialised; here it is zeros);
- BATCH_ITEM_SHAPE: [batch items, rank - 1], the shape without the batch dimension of
  every batch item (a request of batch size 3 gives three rows);
- BATCH_ITEM_SHAPE_FLATTEN: the same values as one 1-D tensor.

None of them has a leading batch dimension of its own: the model sees exactly these
shapes, in the config's `data_type` (TYPE_INT32 or TYPE_FP32). An element count counts
the request's whole tensor, batch dimension included, as Triton's backends count it.

`batch_output` BATCH_SCATTER_WITH_INPUT_SHAPE goes the other way: the model returns one
output for the whole batch, and each request gets the next run of elements, as many as
its `source_input` has, in that input's shape.

Pure functions over shapes and arrays, so every rule has a unit test without processes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shm import datatypes
from shm.errors import ErrorCode, InferError

INPUT_KINDS = (
    "BATCH_ELEMENT_COUNT",
    "BATCH_ACCUMULATED_ELEMENT_COUNT",
    "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO",
    "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE",
    "BATCH_ITEM_SHAPE",
    "BATCH_ITEM_SHAPE_FLATTEN",
)
OUTPUT_KINDS = ("BATCH_SCATTER_WITH_INPUT_SHAPE",)
# the data types Triton's backends can write a batch input in
INPUT_DATATYPES = ("INT32", "FP32")

Shape = tuple[int, ...]


@dataclass(frozen=True)
class BatchInput:
    """One config `batch_input`: what to generate and which model inputs receive it."""

    kind: str
    targets: tuple[str, ...]
    datatype: str  # protocol name: "INT32" or "FP32"
    source: str


@dataclass(frozen=True)
class BatchOutput:
    """One config `batch_output`: outputs scattered in the shape of `source`."""

    kind: str
    targets: tuple[str, ...]
    source: str


def batch_inputs(config: dict) -> list[BatchInput]:
    """The config's batch inputs (config as the JSON dict workers receive). The
    scheduler has validated them; the checks here keep a bad config from reaching a
    batch with an obscure error."""
    out = []
    for entry in config.get("batch_input") or []:
        kind = entry.get("kind") or "BATCH_ELEMENT_COUNT"  # proto default, enum 0
        sources = entry.get("source_input") or []
        if kind not in INPUT_KINDS:
            raise ValueError(f"unknown batch input kind '{kind}'")
        if len(sources) != 1:
            raise ValueError(f"batch input kind '{kind}' expects 1 source input, "
                             f"got {len(sources)}")
        datatype = datatypes.from_config(entry.get("data_type") or "TYPE_INVALID")
        if datatype not in INPUT_DATATYPES:
            raise ValueError("batch input data type must be TYPE_INT32 or TYPE_FP32")
        out.append(BatchInput(kind, tuple(entry.get("target_name") or ()), datatype,
                              sources[0]))
    return out


def batch_outputs(config: dict) -> dict[str, BatchOutput]:
    """{output name: its batch output} for the config's batch outputs."""
    out = {}
    for entry in config.get("batch_output") or []:
        kind = entry.get("kind") or "BATCH_SCATTER_WITH_INPUT_SHAPE"  # enum 0
        sources = entry.get("source_input") or []
        if kind not in OUTPUT_KINDS:
            raise ValueError(f"unknown batch output kind '{kind}'")
        if len(sources) != 1:
            raise ValueError(f"batch output kind '{kind}' expects 1 source input, "
                             f"got {len(sources)}")
        spec = BatchOutput(kind, tuple(entry.get("target_name") or ()), sources[0])
        for name in spec.targets:
            out[name] = spec
    return out


def ragged_inputs(config: dict) -> frozenset[str]:
    return frozenset(io["name"] for io in config.get("input") or []
                     if io.get("allow_ragged_batch"))


def generate(kind: str, datatype: str, shapes: list[Shape]) -> np.ndarray:
    """The batch input of `kind` for requests whose source input had `shapes` (each with
    its batch dimension when the model batches), in `datatype`."""
    dtype = datatypes.to_numpy(datatype)
    counts = [datatypes.num_elements(s) for s in shapes]
    if kind == "BATCH_ELEMENT_COUNT":
        return np.array(counts, dtype=dtype)
    if kind == "BATCH_ACCUMULATED_ELEMENT_COUNT":
        return np.cumsum(counts, dtype=np.int64).astype(dtype)
    if kind == "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO":
        return np.cumsum([0, *counts], dtype=np.int64).astype(dtype)
    if kind == "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE":
        return np.zeros(max(counts, default=0), dtype=dtype)
    if kind in ("BATCH_ITEM_SHAPE", "BATCH_ITEM_SHAPE_FLATTEN"):
        # the first dimension is the batch: one row per batch item, the rest its shape
        rank = max((len(s) for s in shapes), default=1) - 1
        rows = [list(s[1:]) for s in shapes for _ in range(s[0] if s else 0)]
        if any(len(row) != rank for row in rows):
            raise InferError(ErrorCode.INVALID_ARG,
                             f"{kind} needs source inputs of one rank, got shapes "
                             f"{[list(s) for s in shapes]}")
        items = np.array(rows, dtype=dtype).reshape(len(rows), rank)
        return items.reshape(-1) if kind == "BATCH_ITEM_SHAPE_FLATTEN" else items
    raise InferError(ErrorCode.INTERNAL, f"unsupported batch input kind '{kind}'")


def scatter(array, shapes: list[Shape], name: str = "") -> list:
    """A BATCH_SCATTER_WITH_INPUT_SHAPE output split into each request's part: the next
    num_elements(shape) elements, viewed in that shape. Works on numpy and cupy arrays."""
    flat = array.reshape(-1)
    counts = [datatypes.num_elements(s) for s in shapes]
    if flat.shape[0] != sum(counts):
        raise InferError(ErrorCode.INTERNAL,
                         f"batch output '{name}' has {flat.shape[0]} elements, the "
                         f"requests' source inputs have {sum(counts)}")
    parts, start = [], 0
    for shape, count in zip(shapes, counts):
        parts.append(flat[start:start + count].reshape(shape))
        start += count
    return parts


# -- reshape ------------------------------------------------------------------------
#
# A config input or output may carry `reshape { shape: [...] }`: clients speak `dims`,
# the model sees `reshape.shape` (the batch dimension, when max_batch_size > 0, stays in
# front). Triton applies it in its core for every backend: a request's input is handed
# over in the reshaped shape, and a model's output comes back in `dims`. Variable
# dimensions (-1) carry over in order: the k-th -1 of one side takes the k-th variable
# size of the other.


def reshaped(shape, source, target) -> tuple[int, ...] | None:
    """`shape` (no batch dimension), which follows `source`, viewed as `target`; None
    when it cannot be mapped (the tensor is then passed on as it is)."""
    shape, source, target = tuple(shape), tuple(source), tuple(target)
    wild = target.count(-1)
    if wild == 0:
        return target
    count = _product(shape)
    if len(shape) == len(source):
        sizes = [d for d, s in zip(shape, source) if s == -1]
        if len(sizes) == wild:
            it = iter(sizes)
            mapped = tuple(next(it) if d == -1 else d for d in target)
            if _product(mapped) == count:  # a mapping that keeps every element
                return mapped
    if wild == 1:  # the element count decides the one free size
        known = _product(d for d in target if d != -1)
        if known and count % known == 0:
            return tuple(count // known if d == -1 else d for d in target)
    return None


def _product(dims) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


class Reshaper:
    """A model config's reshapes: `input(name, array)` views a request's input in the
    model's shape, `output(name, array)` a model's output in the config's `dims`. Works
    on anything with `.shape` and `.reshape` (numpy, cupy, torch)."""

    def __init__(self, config: dict):
        self.batching = int(config.get("max_batch_size") or 0) > 0
        self._in = self._pairs(config.get("input") or [], to_model=True)
        self._out = self._pairs(config.get("output") or [], to_model=False)

    @staticmethod
    def _pairs(ios: list[dict], to_model: bool) -> dict:
        pairs = {}
        for io in ios:
            if io.get("reshape") is None:
                continue
            dims = tuple(int(d) for d in io.get("dims") or [])
            shape = tuple(int(d) for d in io["reshape"].get("shape") or [])
            pairs[io["name"]] = (dims, shape) if to_model else (shape, dims)
        return pairs

    def __bool__(self) -> bool:
        return bool(self._in or self._out)

    def input(self, name: str, array):
        return self._view(self._in.get(name), array)

    def output(self, name: str, array):
        return self._view(self._out.get(name), array)

    def _view(self, pair, array):
        if pair is None or not hasattr(array, "reshape"):
            return array
        shape = tuple(array.shape)
        lead = shape[:1] if self.batching else ()
        if self.batching and not shape:
            return array
        target = reshaped(shape[len(lead):], *pair)
        if target is None or lead + target == shape:
            return array
        return array.reshape(lead + target)
