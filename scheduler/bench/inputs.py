"""What scripts/bench sends: every input of the model, read from its metadata, filled
with random data, zeros or perf_analyzer's JSON input data; and which outputs it asks
for. A client module (scheduler/bench/main.py's), never imported by the server's processes.

Shapes follow perf_analyzer where a user of it would look for them: `--shape NAME:16`
gives the dims after the batch dim, which `-b` sets when the model batches
(max_batch_size > 0). An unnamed `--shape 1,16` keeps this bench's older meaning: the
whole request shape, batch dim included, of every input (one input, usually).
"""

from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass, field

# dims a model leaves variable (-1) and no --shape names: this many (the bench's old
# default request was [1, 16])
DEFAULT_VARIABLE_DIM = 16
STRING_LENGTH = 16  # characters of a random BYTES element (perf_analyzer: 128)


@dataclass
class TensorSpec:
    """One input as sent: its name, datatype and full request shape."""

    name: str
    datatype: str
    shape: list


@dataclass
class OutputSpec:
    """One requested output; `nbytes` sizes its shm region (-1: unknown)."""

    name: str
    datatype: str = ""
    nbytes: int = -1


@dataclass
class Workload:
    """The tensors of one point of the sweep."""

    inputs: list
    outputs: list
    batch_size: int = 1
    notes: list = field(default_factory=list)  # what was guessed, said once

    def label(self) -> str:
        return " ".join(f"{t.name}:{_fmt(t.shape)}" for t in self.inputs)


def _fmt(shape) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def parse_named_shape(text: str):
    """'INPUT0:1,16' -> ('INPUT0', [1, 16]); '1,16' -> (None, [1, 16]). A name may
    itself hold colons: the dims are after the last one."""
    text = str(text).strip()
    name = None
    if ":" in text:
        name, text = text.rsplit(":", 1)
        name = name.strip()
        if not name:
            raise ValueError(f"empty input name in --shape {text!r}")
    s = text.strip().strip("[]()").replace("x", ",")
    dims = [t.strip() for t in s.split(",") if t.strip()]
    if not dims:
        raise ValueError(f"empty shape: {text!r}")
    out = []
    for d in dims:
        v = int(d)
        if v <= 0:
            raise ValueError(f"dims must be positive: {d!r} in {text!r}")
        out.append(v)
    return name, out


def element_count(shape) -> int:
    return math.prod(int(d) for d in shape)


def dtype_size(datatype: str) -> int:
    """Bytes per element of a numeric datatype; 0 for BYTES."""
    return {"BOOL": 1, "UINT8": 1, "INT8": 1, "UINT16": 2, "INT16": 2, "FP16": 2,
            "BF16": 2, "UINT32": 4, "INT32": 4, "FP32": 4, "UINT64": 8, "INT64": 8,
            "FP64": 8}.get(datatype, 0)


def workload_from_metadata(metadata: dict, max_batch_size: int, batch_size: int = 1,
                           named: dict | None = None, whole=None,
                           output_names=None) -> Workload:
    """The tensors to send to a model with this metadata (KServe's model metadata
    JSON; gRPC's int64 dims may come as strings). `named`: NAME -> dims after the batch
    dim (perf_analyzer's --shape); `whole`: an unnamed full request shape for every
    input; `output_names`: ask for these outputs only (default all)."""
    named = dict(named or {})
    inputs, notes = [], []
    known = {i["name"] for i in metadata.get("inputs", [])}
    for n in named:
        if n not in known:
            raise ValueError(f"--shape names {n!r}, which is not an input of the model "
                             f"(inputs: {', '.join(sorted(known))})")
    batched = max_batch_size > 0
    if batched and batch_size > max_batch_size:
        raise ValueError(f"batch size {batch_size} is above the model's max_batch_size "
                         f"{max_batch_size}")
    if not batched and batch_size != 1:
        raise ValueError("the model does not batch (max_batch_size 0): -b must be 1")
    for meta in metadata.get("inputs", []):
        name, datatype = meta["name"], meta["datatype"]
        dims = [int(d) for d in meta.get("shape", [])]
        if batched and dims:
            dims = dims[1:]  # the metadata's first dim is the batch dim (-1)
        if whole is not None:
            shape = list(whole)
        elif name in named:
            given = named[name]
            if len(given) != len(dims):
                raise ValueError(f"--shape {name}:{','.join(map(str, given))} has "
                                 f"{len(given)} dims; the model's {name} has {len(dims)} "
                                 f"(after the batch dim)")
            for g, d in zip(given, dims):
                if d > 0 and g != d:
                    raise ValueError(f"--shape {name}: dim {g} where the model fixes {d}")
            shape = ([batch_size] if batched else []) + list(given)
        else:
            if any(d < 0 for d in dims):
                notes.append(f"{name}: variable dims set to {DEFAULT_VARIABLE_DIM} "
                             f"(choose with --shape {name}:...)")
            shape = ([batch_size] if batched else []) + \
                [d if d > 0 else DEFAULT_VARIABLE_DIM for d in dims]
        inputs.append(TensorSpec(name, datatype, shape))
    outputs = []
    for meta in metadata.get("outputs", []):
        if output_names and meta["name"] not in output_names:
            continue
        dims = [int(d) for d in meta.get("shape", [])]
        if batched and dims:
            dims = [batch_size] + dims[1:]
        size = dtype_size(meta["datatype"])
        nbytes = element_count(dims) * size if dims and all(d > 0 for d in dims) \
            and size else -1
        outputs.append(OutputSpec(meta["name"], meta["datatype"], nbytes))
    if output_names:
        missing = set(output_names) - {o.name for o in outputs}
        if missing:
            raise ValueError(f"the model has no output {', '.join(sorted(missing))}")
    return Workload(inputs, outputs, batch_size, notes)


# ---------------------------------------------------------------------- input data


def load_input_data(path: str, inputs: list) -> list[dict]:
    """perf_analyzer's JSON input data: {"data": [{"INPUT0": [...], ...}, ...]}, each
    entry one request's tensors. A tensor is a flat list, or {"content": [...],
    "shape": [...]}, or {"b64": "..."} (raw bytes). Returns one {name: numpy array}
    per entry, shaped as `inputs` says unless the entry gives its own shape. Data
    streams (below) come back one after the other."""
    return [e for stream in load_input_streams(path, inputs) for e in stream]


def load_input_streams(path: str, inputs: list) -> list[list[dict]]:
    """The data streams of a JSON input data file: for a sequence model,
    {"data": [[step, step, ...], [...]]} gives one stream per inner list, the steps of
    one sequence; a flat {"data": [entry, ...]} is one stream (perf_analyzer's
    input_data.md)."""
    with open(path) as f:
        doc = json.load(f)
    return parse_input_streams(doc, inputs)


def parse_input_data(doc, inputs: list) -> list[dict]:
    return [e for stream in parse_input_streams(doc, inputs) for e in stream]


def parse_input_streams(doc, inputs: list) -> list[list[dict]]:
    import numpy as np
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list) \
            or not doc["data"]:
        raise ValueError('input data must be {"data": [{...}, ...]} with one entry or more')
    nested = all(isinstance(s, list) for s in doc["data"])
    streams = doc["data"] if nested else [doc["data"]]
    out = []
    for i, stream in enumerate(streams):
        if not stream:
            raise ValueError(f"input data stream {i} is empty")
        entries = []
        for j, entry in enumerate(stream):
            k = f"{i}.{j}" if nested else j
            if not isinstance(entry, dict):
                raise ValueError(f"input data entry {k} is not an object")
            arrays = {}
            for spec in inputs:
                if spec.name not in entry:
                    raise ValueError(f"input data entry {k} has no {spec.name!r}")
                arrays[spec.name] = _tensor(entry[spec.name], spec, k, np)
            entries.append(arrays)
        out.append(entries)
    return out


def load_validation_streams(path: str, outputs: list) -> list[list[dict]] | None:
    """The expected outputs of a JSON input data file's "validation_data" (None if it
    has none): the same layout as its "data" (streams or a flat list), each entry
    {output name: values} for some of `outputs` ({"name", "datatype"}), compared as
    flat arrays with the response's."""
    with open(path) as f:
        doc = json.load(f)
    return parse_validation_streams(doc, outputs)


def parse_validation_streams(doc, outputs: list) -> list[list[dict]] | None:
    import numpy as np
    if not isinstance(doc, dict) or "validation_data" not in doc:
        return None
    data, valid = doc.get("data"), doc["validation_data"]
    nested = isinstance(data, list) and data and all(isinstance(s, list) for s in data)
    streams = valid if nested else [valid]
    shape_of = (lambda x: [len(s) if isinstance(s, list) else -1 for s in x]) \
        if nested else (lambda x: [len(x)])
    if not isinstance(valid, list) or not isinstance(data, list) \
            or (nested and not all(isinstance(s, list) for s in valid)) \
            or shape_of(valid) != shape_of(data):
        raise ValueError('"validation_data" must have one entry per entry of "data", '
                         "in the same layout")
    types = {o["name"]: o.get("datatype") or "" for o in outputs}
    out = []
    for i, stream in enumerate(streams):
        entries = []
        for j, entry in enumerate(stream):
            if not isinstance(entry, dict):
                raise ValueError(f"validation data entry {j} is not an object")
            unknown = sorted(set(entry) - set(types))
            if unknown:
                raise ValueError(f"validation data names no output the bench asks for: "
                                 f"{', '.join(unknown)}")
            entries.append({name: _expected(v, name, types[name], np)
                            for name, v in entry.items()})
        out.append(entries)
    return out


def _expected(value, name: str, datatype: str, np):
    """One expected output, flattened."""
    if isinstance(value, dict):
        if "b64" in value:
            raw = base64.b64decode(value["b64"])
            if datatype == "BYTES":
                return np.array([raw], dtype=np.object_)
            return np.frombuffer(raw, dtype=_np_dtype(datatype)).copy()
        if "content" not in value:
            raise ValueError(f"validation data {name}: an object needs 'content' or 'b64'")
        value = value["content"]
    if datatype == "BYTES":
        flat = np.array(value, dtype=np.object_).ravel()
        return np.array([v.encode() if isinstance(v, str) else bytes(v) for v in flat],
                        dtype=np.object_)
    return np.array(value).ravel().astype(_np_dtype(datatype)) if datatype \
        else np.array(value).ravel()


def _tensor(value, spec: TensorSpec, k: int, np):
    shape = list(spec.shape)
    if isinstance(value, dict):
        if "shape" in value:
            shape = [int(d) for d in value["shape"]]
        if "b64" in value:
            raw = base64.b64decode(value["b64"])
            if spec.datatype == "BYTES":
                return np.array([raw], dtype=np.object_).reshape(shape)
            return np.frombuffer(raw, dtype=_np_dtype(spec.datatype)).reshape(shape).copy()
        if "content" not in value:
            raise ValueError(f"input data entry {k}, {spec.name}: an object needs "
                             f"'content' or 'b64'")
        value = value["content"]
    flat = np.array(value, dtype=np.object_ if spec.datatype == "BYTES" else None).ravel()
    if flat.size != element_count(shape):
        raise ValueError(f"input data entry {k}, {spec.name}: {flat.size} values for "
                         f"shape {_fmt(shape)}")
    if spec.datatype == "BYTES":
        return np.array([v.encode() if isinstance(v, str) else bytes(v) for v in flat],
                        dtype=np.object_).reshape(shape)
    return flat.astype(_np_dtype(spec.datatype)).reshape(shape)


def _np_dtype(datatype: str):
    from tritonclient.utils import triton_to_np_dtype
    dt = triton_to_np_dtype(datatype)
    if dt is None:
        raise ValueError(f"unsupported datatype {datatype}")
    return dt


def make_arrays(inputs: list, mode: str, seed: int, entries: list | None = None,
                string_length: int | None = None, string_data: str | None = None) -> dict:
    """One request's tensors: random (seeded), zeros, or entry `seed` of a data file's
    `entries` (cycled). BYTES elements: `string_data` if given, else random letters
    (`string_length` of them) or b"0"."""
    import numpy as np
    if entries:
        return {k: v.copy() for k, v in entries[seed % len(entries)].items()}
    rng = np.random.default_rng(seed + 1)
    out = {}
    for spec in inputs:
        if spec.datatype == "BYTES":
            n = element_count(spec.shape)
            if string_data is not None:
                items = [string_data.encode()] * n
            elif mode == "zero":
                items = [b"0"] * n
            else:
                letters = rng.integers(97, 123, size=(n, string_length or STRING_LENGTH),
                                       dtype=np.uint8)
                items = [row.tobytes() for row in letters]
            out[spec.name] = np.array(items, dtype=np.object_).reshape(spec.shape)
            continue
        dt = _np_dtype(spec.datatype)
        if mode == "zero":
            out[spec.name] = np.zeros(spec.shape, dtype=dt)
        elif dt == np.bool_:
            out[spec.name] = rng.integers(0, 2, size=spec.shape).astype(np.bool_)
        elif np.issubdtype(dt, np.integer):
            out[spec.name] = rng.integers(0, 100, size=spec.shape).astype(dt)
        else:
            out[spec.name] = rng.random(size=spec.shape).astype(dt)
    return out


# ---------------------------------------------------------------------- the server


def fetch_model_info(url: str, protocol: str, model: str, timeout: float = 30.0,
                     version: str = "", with_config: bool = False):
    """(metadata, max_batch_size) of `model`, over the protocol the bench speaks; with
    `with_config`, its config (as JSON) too."""
    if protocol == "grpc":
        import tritonclient.grpc as mod
        client = mod.InferenceServerClient(url)
        try:
            meta = client.get_model_metadata(model, version, as_json=True,
                                             client_timeout=timeout)
            cfg = client.get_model_config(model, version, as_json=True,
                                          client_timeout=timeout)["config"]
        finally:
            client.close()
    else:
        import tritonclient.http as mod
        client = mod.InferenceServerClient(url, network_timeout=timeout)
        try:
            meta = client.get_model_metadata(model, version)
            cfg = client.get_model_config(model, version)
        finally:
            client.close()
    out = (meta, int(cfg.get("max_batch_size", 0) or 0))
    return out + (cfg,) if with_config else out


def model_kind(config: dict) -> tuple[bool, bool]:
    """(has a sequence batcher, is decoupled) from a model's config as JSON (gRPC's
    JSON and HTTP's spell the fields alike)."""
    policy = config.get("model_transaction_policy") or {}
    return bool(config.get("sequence_batching") is not None), bool(policy.get("decoupled"))
