"""Triton's classification extension: an output requested with `classification: k`
(tritonclient's `class_count`) comes back as the top k of each batch item, as BYTES
strings "<value>:<index>[:<label>]", for HTTP and gRPC alike."""

from __future__ import annotations

import struct

import numpy as np

from shm.datatypes import NUMPY
from shm.errors import ErrorCode, InferError

from .types import InferResult, RequestedOutput

CLASSIFIABLE = {"UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
                "FP16", "FP32", "FP64"}
_LEN = struct.Struct("<I")


def wanted(requested: list[RequestedOutput] | None) -> bool:
    """Whether any requested output asks for classes."""
    return bool(requested) and any(o.class_count for o in requested)


def apply(result: InferResult, requested: list[RequestedOutput], batching: bool,
          labels: dict | None) -> None:
    """Replace, in `result`, each output the request asked classes of (`labels`:
    {output: [label, ...]} from the model's label files)."""
    counts = {o.name: o.class_count for o in requested if o.class_count}
    for out in result.outputs:
        k = counts.get(out.name)
        if k and out.data is not None:
            out.datatype, out.shape, out.data = classify(
                out.name, out.datatype, out.shape, out.data, k, batching,
                labels.get(out.name) if labels else None)


def classify(name: str, datatype: str, shape, data, class_count: int, batching: bool,
             labels=None):
    """Top-k classification of an output, as Triton's classification extension.

    Each entry is "<value>:<index>" or "<value>:<index>:<label>", highest first,
    per batch entry; returns (datatype "BYTES", shape, length-prefixed bytes)."""
    if datatype not in CLASSIFIABLE:
        raise InferError(ErrorCode.INVALID_ARG, "class result not available for output due to unsupported type "
                   f"'{datatype}'")
    batch = shape[0] if batching and shape else 0
    per = 1
    for d in (shape[1:] if batch else shape):
        per *= d
    values = np.frombuffer(data, dtype=NUMPY[datatype])
    if values.size != max(batch, 1) * per:
        raise InferError(ErrorCode.INTERNAL,
                         f"output tensor shape does not match size of output for '{name}'")
    k = min(class_count, per)
    is_float = datatype[0] == "F"
    parts = []
    for row in values.reshape(max(batch, 1), per):
        for idx in np.argsort(-row.astype(np.float64), kind="stable")[:k]:
            idx = int(idx)
            text = ("%f" % row[idx] if is_float else str(int(row[idx]))) + f":{idx}"
            if labels is not None and idx < len(labels):
                text += ":" + labels[idx]
            raw = text.encode("utf-8")
            parts.append(_LEN.pack(len(raw)))
            parts.append(raw)
    return "BYTES", ([batch, k] if batch else [k]), b"".join(parts)
