"""Property-based tests (Hypothesis) of the HTTP request path: the decoders in
frontend/http_codec.py and the checks in frontend/validate.py, run in the order the
HTTP server runs them (decompress, parse_header_length, decode_raw_request or
decode_infer_request, validate_request).

Two properties. Hostile input, as a fuzzer would send it (arbitrary bytes, arbitrary
JSON, and valid requests with a few mutations: wrong types, bad shapes and datatypes,
lying sizes, corrupt BYTES prefixes, truncated or padded binary sections, deep
nesting) is either accepted or refused with InferError whose status is a 4xx, and
nothing else escapes. Valid requests, whether built here or by tritonclient's own
encoder, decode into exactly the tensors, outputs and parameters that were sent.
Each hostile-input test also checks that its examples reached the error paths it is
about, so a strategy that stopped reaching the decoder would fail the test.
"""

from __future__ import annotations

import functools
import gzip
import json
import re
import zlib

import numpy as np
import pytest
import tritonclient.http as httpclient
from google.protobuf import text_format
from hypothesis import Phase, given, note, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from tritonclient.grpc import model_config_pb2

from frontend import http_codec
from frontend.validate import validate_request
from shm.datatypes import NUMPY, from_config
from shm.errors import HTTP_STATUS, InferError

# --------------------------------------------------------------------------- models


def _config(text: str) -> model_config_pb2.ModelConfig:
    return text_format.Parse(text, model_config_pb2.ModelConfig())


CONFIGS = [
    _config('name: "mfp" max_batch_size: 8 '
            'input [{name: "INPUT0" data_type: TYPE_FP32 dims: [-1]}, '
            '       {name: "INPUT1" data_type: TYPE_INT64 dims: [2]}] '
            'output [{name: "OUTPUT0" data_type: TYPE_FP32 dims: [-1]}]'),
    _config('name: "mstr" max_batch_size: 0 '
            'input [{name: "TEXT" data_type: TYPE_STRING dims: [-1]}, '
            '       {name: "FLAG" data_type: TYPE_BOOL dims: [1] optional: true}] '
            'output [{name: "OUT" data_type: TYPE_STRING dims: [-1]}]'),
    _config('name: "mint" max_batch_size: 0 '
            'input [{name: "X" data_type: TYPE_INT8 dims: [2, -1]}, '
            '       {name: "Y" data_type: TYPE_FP16 dims: [-1]}, '
            '       {name: "Z" data_type: TYPE_UINT32 dims: [1]}] '
            'output [{name: "OUT" data_type: TYPE_INT8 dims: [-1]}]'),
]
# models whose only input a raw request (Inference-Header-Content-Length: 0) fills
RAW_CONFIGS = [
    _config('name: "raw16" max_batch_size: 4 '
            'input [{name: "IN" data_type: TYPE_UINT16 dims: [-1, 2]}]'),
    _config('name: "rawstr" max_batch_size: 0 '
            'input [{name: "S" data_type: TYPE_STRING dims: [1]}]'),
    _config('name: "rawfixed" max_batch_size: 0 '
            'input [{name: "F" data_type: TYPE_FP64 dims: [3]}]'),
]
# one of CONFIGS, drawn by the composites (a strategy made once, not at every draw)
ANY_CONFIG = st.sampled_from(CONFIGS)

DATATYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32",
             "INT64", "FP16", "FP32", "FP64", "BYTES", "BF16"]
BAD_DATATYPES = ["", "FP8", "fp32", "INT128", "STRING", "TYPE_FP32", "BYTES\0"]
HUGE = [2**31, 2**32, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 2**100, -(2**63), -1]


def _dtype_name(value: int) -> str:
    return from_config(model_config_pb2.DataType.Name(value))


# ------------------------------------------------------------------------- helpers


def client_error(fn, *args, **kwargs):
    """fn(*args) or the InferError it raised, which must be a client error (4xx);
    any other exception fails the test (it propagates)."""
    try:
        return fn(*args, **kwargs)
    except InferError as e:
        note(f"refused: {e!r}")
        assert HTTP_STATUS[e.code] < 500, f"a 5xx for the client's garbage: {e!r}"
        assert e.message, "an error without a message"
        return e


def serve(body: bytes, header: str | None, config, encoding: str | None = None):
    """What the HTTP server does with a body, up to the model: the request, or the
    InferError the client is answered with."""
    def run():
        data = http_codec.decompress(body, encoding, 1 << 20) if encoding else body
        length = http_codec.parse_header_length(header, len(data))
        if length == 0:
            req = http_codec.decode_raw_request(data, config, config.name)
        else:
            req = http_codec.decode_infer_request(data, length, config.name)
        validate_request(req, config)
        return req
    return client_error(run)


class Seen:
    """The kinds of refusal a test's examples met, to check its strategies reach the
    error paths they are about (not only the first type check at the door)."""

    def __init__(self):
        self.messages: list[str] = []
        self.accepted = 0

    def add(self, outcome) -> None:
        if isinstance(outcome, InferError):
            self.messages.append(outcome.message)
        else:
            self.accepted += 1

    def missing(self, patterns) -> list[str]:
        return [p for p in patterns if not any(re.search(p, m) for m in self.messages)]

    def stop_once_reached(self, pattern: str) -> None:
        """Ends a reach test's examples at the first that meets `pattern` (see REACH)."""
        if REACH_STOPS and not self.missing([pattern]):
            raise Reached


class Reached(Exception):
    """A reach test's property met its check; `run_until_reached` ends there."""


# A reach test asks that one mutation meets its check at least once. The deterministic
# profiles draw the same examples every run, so the examples after the first hit only
# repeat what the hostile-input tests check on every mutation at once; they stop there
# (no shrinking: a hit is not a failure). The fuzz profile draws fresh examples and
# runs them all.
REACH_STOPS = settings.default.derandomize
REACH = settings(max_examples=40, phases=[Phase.explicit, Phase.generate])


def run_until_reached(prop) -> None:
    try:
        prop()
    except Reached:
        pass


def raw_bytes(arr: np.ndarray, datatype: str) -> bytes:
    """Triton's raw layout of `arr`: little-endian, row-major, BYTES length-prefixed."""
    if datatype == "BYTES":
        return b"".join(len(v).to_bytes(4, "little") + v for v in arr.reshape(-1))
    return np.ascontiguousarray(arr, dtype=NUMPY[datatype].newbyteorder("<")).tobytes()


def decoded_bytes(data) -> bytes:
    return bytes(data) if isinstance(data, (bytes, bytearray)) else \
        memoryview(data).cast("B").tobytes()


# ---------------------------------------------------------------------- strategies

json_scalars = (st.none() | st.booleans() | st.integers(-(2**70), 2**70)
                | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=6))
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6),
                                                                inner, max_size=4),
    max_leaves=12)


@functools.lru_cache(maxsize=None)
def elements(datatype: str, json_safe: bool):
    """Values of one element of `datatype`, as numpy holds them (each built once: a
    strategy made anew at every draw is validated anew, which cost more than the
    draw)."""
    dtype = NUMPY[datatype] if datatype != "BYTES" else None
    if datatype == "BYTES":
        if json_safe:
            return st.text(max_size=6).map(lambda s: s.encode("utf-8"))
        return st.binary(max_size=6)
    if dtype.kind == "f":
        return st.floats(width=dtype.itemsize * 8, allow_nan=not json_safe,
                         allow_infinity=not json_safe)
    return hnp.from_dtype(dtype)


@st.composite
def tensor(draw, datatype: str, dims, batch: int | None, json_safe: bool):
    """A numpy array that fits config dims (-1 filled in), batched when `batch`."""
    shape = [draw(st.integers(0, 3)) if d == -1 else d for d in dims]
    if batch is not None:
        shape = [batch] + shape
    return draw(_arrays(datatype, tuple(shape), json_safe))


@functools.lru_cache(maxsize=None)
def _arrays(datatype: str, shape: tuple, json_safe: bool):
    dtype = object if datatype == "BYTES" else NUMPY[datatype]
    return hnp.arrays(dtype, shape, elements=elements(datatype, json_safe))


@functools.lru_cache(maxsize=None)
def tensor_of(datatype: str, dims: tuple, batch: int | None, json_safe: bool):
    """tensor(...), one strategy per set of arguments (see elements)."""
    return tensor(datatype, list(dims), batch, json_safe)


@st.composite
def valid_request(draw, config):
    """A request the model accepts: ({header}, [binary parts], {name: raw bytes})."""
    mbs = config.max_batch_size
    batch = draw(st.integers(1, mbs)) if mbs > 0 else None
    inputs, blobs, expect = [], [], {}
    for spec in config.input:
        if spec.optional and draw(st.booleans()):
            continue
        datatype = _dtype_name(spec.data_type)
        binary = datatype == "BF16" or draw(st.booleans())
        arr = draw(tensor_of(datatype, tuple(spec.dims), batch, not binary))
        raw = raw_bytes(arr, datatype)
        item = {"name": spec.name, "datatype": datatype, "shape": list(arr.shape)}
        if binary:
            item["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        elif datatype == "BYTES":
            item["data"] = [v.decode("utf-8") for v in arr.reshape(-1)]
        else:
            # nested as the shape says, or flat: Triton takes both
            item["data"] = arr.tolist() if draw(st.booleans()) else arr.reshape(-1).tolist()
        inputs.append(item)
        expect[spec.name] = raw
    inputs = draw(st.permutations(inputs))
    # binary parts follow the inputs' order in the header
    order = [i["name"] for i in inputs if "parameters" in i]
    blobs = [expect[n] for n in order]
    header = {"inputs": inputs}
    if draw(st.booleans()):
        header["id"] = draw(st.text(max_size=8))
    if draw(st.booleans()):
        header["outputs"] = [{"name": o.name, "parameters": {"binary_data": draw(
            st.booleans())}} for o in config.output]
    if draw(st.booleans()):
        header["parameters"] = {"sequence_id": draw(st.integers(0, 2**64 - 1)),
                                "custom": draw(_CUSTOM)}
    return header, blobs, expect


def encode(header, blobs) -> tuple[bytes, str | None]:
    text = json.dumps(header).encode()
    if not blobs:
        return text, None
    return text + b"".join(blobs), str(len(text))


def _inputs(header) -> list:
    inputs = header.get("inputs")
    return inputs if isinstance(inputs, list) else []


def _pick(draw, header):
    """One of the header's input objects, or a new one when there is none."""
    items = [i for i in _inputs(header) if isinstance(i, dict)]
    if not items:
        header["inputs"] = items = [{}]
    return draw(st.sampled_from(items))


def _binary_items(header):
    return [i for i in _inputs(header) if isinstance(i, dict)
            and isinstance(i.get("parameters"), dict)
            and "binary_data_size" in i["parameters"]]


# The strategies the composites draw from, each built once: one made inside a
# composite is built and validated again at every draw, which cost as much as drawing.
_CUSTOM = st.text(max_size=4) | st.integers(-(2**63), 2**63 - 1) | st.booleans()
_SHAPES = st.lists(st.integers(-3, 6) | st.sampled_from(HUGE), max_size=4) | json_values
_NEAR = st.sampled_from([-1, 1, 2])
_DATATYPE_VALUES = st.sampled_from(DATATYPES + BAD_DATATYPES) | json_values
_INPUT_FIELDS = st.sampled_from(["name", "datatype", "shape", "data", "parameters"])
_REQUEST_FIELDS = st.sampled_from(["id", "inputs", "outputs", "parameters"])
_BAD_DATA = (st.lists(json_scalars, max_size=8) | st.lists(
    st.lists(st.integers(-300, 2**64 + 1) | st.floats(), max_size=3), max_size=3)) \
    | json_values
_DEPTHS = st.sampled_from([64, 1000, 5000, 100_000])
_PARAM_KEYS = st.sampled_from([
    "sequence_id", "sequence_start", "sequence_end", "priority", "timeout",
    "binary_data_output", "triton_x", "custom", "shared_memory_region",
    "shared_memory_offset", "shared_memory_byte_size", "binary_data_size"])
_PARAM_VALUES = json_values | st.sampled_from(HUGE)
_OUTPUTS = st.lists(st.fixed_dictionaries(
    {"name": st.sampled_from(["OUTPUT0", "OUT", "nope"]) | json_values},
    optional={"parameters": st.dictionaries(
        st.sampled_from(["binary_data", "classification", "shared_memory_region",
                         "shared_memory_byte_size", "shared_memory_offset"]),
        json_values | st.sampled_from(HUGE), max_size=3)}), max_size=3) | json_values
_ENCODINGS = st.sampled_from(["gzip", "deflate"])
_DEEP_BODY_DEPTHS = st.sampled_from([1000, 5000, 100_000])


# Each mutation takes (draw, header, blobs) and changes them in place; the header
# length, when it is the mutation, comes back as the third value.
def m_shape(draw, header, blobs):
    item = _pick(draw, header)
    item["shape"] = draw(_SHAPES)


def m_shape_near(draw, header, blobs):
    """One dimension off by a little: the shape the config allows, the data not."""
    binary = _binary_items(header)
    item = draw(st.sampled_from(binary)) if binary else _pick(draw, header)
    shape = item.get("shape")
    if isinstance(shape, list) and shape and all(type(d) is int for d in shape):
        k = draw(st.integers(0, len(shape) - 1))
        shape[k] = max(shape[k] + draw(_NEAR), 0)


def m_datatype(draw, header, blobs):
    item = _pick(draw, header)
    item["datatype"] = draw(_DATATYPE_VALUES)


def m_field(draw, header, blobs):
    """Drop a field of an input, or give it a value of another type."""
    item = _pick(draw, header)
    key = draw(_INPUT_FIELDS)
    if draw(st.booleans()):
        item.pop(key, None)
    else:
        item[key] = draw(json_values)


def m_request_field(draw, header, blobs):
    key = draw(_REQUEST_FIELDS)
    header[key] = draw(json_values)


def m_binary_size(draw, header, blobs):
    """A lying binary_data_size."""
    items = _binary_items(header)
    if not items:
        return
    params = draw(st.sampled_from(items))["parameters"]
    size = params["binary_data_size"]
    params["binary_data_size"] = draw(
        st.integers(-8, 8).map(lambda d: max(size + d, -8)) | st.sampled_from(HUGE)
        | st.sampled_from([None, "4", 4.0, True, [4]]))


def m_bytes_prefix(draw, header, blobs):
    """A BYTES element whose 4-byte length prefix lies, or a torn prefix at the end."""
    for k, item in enumerate(_binary_items(header)):
        if item.get("datatype") == "BYTES" and draw(st.booleans()):
            blobs[k] += draw(st.binary(min_size=1, max_size=3))
            item["parameters"]["binary_data_size"] = len(blobs[k])
            return
        if item.get("datatype") == "BYTES" and len(blobs[k]) >= 4:
            blob = bytearray(blobs[k])
            at = draw(st.integers(0, len(blob) - 4))
            blob[at:at + 4] = draw(st.integers(0, 2**32 - 1)).to_bytes(4, "little")
            blobs[k] = bytes(blob)
            return
    # no binary BYTES input: a broken one instead of the model's (last, so the
    # binary parts stay in order)
    inputs = [i for i in _inputs(header) if not (isinstance(i, dict)
                                                  and i.get("name") == "TEXT")]
    count = draw(st.integers(1, 3))
    inputs.append({"name": "TEXT", "datatype": "BYTES", "shape": [count],
                   "parameters": {"binary_data_size": 6}})
    header["inputs"] = inputs
    blobs.append(draw(st.integers(0, 2**32 - 1)).to_bytes(4, "little") + b"ab")


def m_truncate(draw, header, blobs):
    if blobs:
        k = draw(st.integers(0, len(blobs) - 1))
        blobs[k] = blobs[k][:draw(st.integers(0, max(len(blobs[k]) - 1, 0)))]


def m_pad(draw, header, blobs):
    blobs.append(draw(st.binary(min_size=1, max_size=16)))


def m_dup(draw, header, blobs):
    """The same input twice."""
    inputs = _inputs(header)
    if inputs:
        k = draw(st.integers(0, len(inputs) - 1))
        inputs.append(json.loads(json.dumps(inputs[k])))
        binary = _binary_items(header)
        if inputs[k] in binary:
            blobs.append(blobs[binary.index(inputs[k])])


def m_drop(draw, header, blobs):
    """An input left out, or renamed."""
    inputs = _inputs(header)
    if not inputs:
        return
    k = draw(st.integers(0, len(inputs) - 1))
    if inputs[k] not in _binary_items(header) and draw(st.booleans()):
        del inputs[k]
    elif isinstance(inputs[k], dict):
        inputs[k]["name"] = draw(st.text(max_size=6))


def m_data(draw, header, blobs):
    """JSON data of the wrong count, nesting or element type."""
    item = _pick(draw, header)
    if "parameters" in item:
        return
    item["data"] = draw(_BAD_DATA)


def m_deep(draw, header, blobs):
    """Nesting deeper than any decoder's stack."""
    depth = draw(_DEPTHS)
    item = _pick(draw, header)
    value = 1
    for _ in range(min(depth, 900)):  # json.dumps itself recurses
        value = [value]
    item["data"] = value


def m_params(draw, header, blobs):
    """Request or input parameters with the wrong types or reserved names."""
    if draw(st.booleans()):
        target = header.setdefault("parameters", {})
    else:
        target = _pick(draw, header).setdefault("parameters", {})
    if isinstance(target, dict):
        target[draw(_PARAM_KEYS)] = draw(_PARAM_VALUES)


def m_outputs(draw, header, blobs):
    header["outputs"] = draw(_OUTPUTS)


# the ones that reach the deepest checks (byte sizes, BYTES prefixes) weigh double
MUTATIONS = [m_shape, m_shape_near, m_shape_near, m_datatype, m_field, m_request_field,
             m_binary_size, m_bytes_prefix, m_bytes_prefix, m_truncate, m_pad, m_dup,
             m_drop, m_data, m_deep, m_params, m_outputs]


_MUTATION_LISTS = st.lists(st.sampled_from(MUTATIONS), min_size=1, max_size=2)


@st.composite
def hostile_request(draw):
    """(config, body, header length value, encoding) for a valid request after
    1 or 2 mutations, and sometimes a lying Inference-Header-Content-Length."""
    config = draw(ANY_CONFIG)
    header, blobs, _ = draw(valid_request(config))
    for mutate in draw(_MUTATION_LISTS):
        note(f"mutation: {mutate.__name__}")
        if mutate is m_deep:
            mutate(draw, header, blobs)
            body, length = _deep_body(draw, header, blobs)
            break
        mutate(draw, header, blobs)
    else:
        body, length = encode(header, blobs)
        if length is None and blobs:
            length = str(len(body))
    if draw(st.integers(0, 7)) == 5:
        length = draw(st.none() | st.integers(-5, len(body) + 5).map(str)
                      | st.sampled_from(["", "abc", "1e3", "0x10", " 7", "-0",
                                         str(2**64), "9" * 5000]))
    encoding = None
    if draw(st.integers(0, 9)) == 5:
        encoding = draw(_ENCODINGS)
        body = gzip.compress(body) if encoding == "gzip" else zlib.compress(body)
        if draw(st.booleans()):
            body = body[:draw(st.integers(0, len(body)))]
    return config, body, length, encoding


def _deep_body(draw, header, blobs):
    """The header with one input's data nested far deeper than json.dumps goes."""
    depth = draw(_DEEP_BODY_DEPTHS)
    text = json.dumps(header).replace("[[[[", "[" * depth + "[[[[", 1)
    text = text.replace("]]]]", "]" * depth + "]]]]", 1)
    body = text.encode() + b"".join(blobs)
    return body, (str(len(text)) if blobs else None)


# ----------------------------------------------------------------------- properties


def test_arbitrary_bytes_are_refused_with_a_client_error():
    seen = Seen()

    @given(body=st.binary(max_size=200) | json_values.map(lambda v: json.dumps(v).encode()),
           length=st.none() | st.integers(0, 300).map(str),
           config=st.sampled_from(CONFIGS + RAW_CONFIGS))
    def prop(body, length, config):
        seen.add(serve(body, length, config))

    prop()
    assert not seen.missing([
        "failed to parse the request JSON buffer",
        "expected a JSON object",
        "inference header size should be in range",
        "Unable to parse 'inputs'",
    ]), seen.messages[:20]


def test_hostile_requests_are_refused_with_a_client_error():
    seen = Seen()

    @settings(max_examples=3 * settings.default.max_examples)
    @given(hostile_request())
    def prop(case):
        config, body, length, encoding = case
        seen.add(serve(body, length, config, encoding))

    prop()
    # which check each mutation reaches is test_each_mutation_reaches_its_check's
    assert not seen.missing([r"Unable to parse", r"\[request id: "]), seen.messages[:30]
    assert seen.accepted, "no mutated request got through: mutations always fatal?"


# the refusal each mutation must reach at least once, alone on a valid request
REACHES = {
    m_shape: r"Unable to parse 'shape'|unexpected shape for input",
    m_shape_near: r"input byte size mismatch",
    m_datatype: r"data-type is",
    m_field: r"Unable to parse '(name|datatype|shape|data|parameters)'",
    m_request_field: r"Unable to parse '(id|inputs|outputs|parameters)'",
    m_binary_size: r"Unable to parse 'binary_data_size'|unexpected size for input",
    m_bytes_prefix: r"element byte size (indicator )?exceeds the end of the buffer",
    m_truncate: r"unexpected size for input",
    m_pad: r"unexpected additional input data",
    m_dup: r"already exists in request",
    m_drop: r"expected (number of )?\d* ?(and \d+ )?inputs|unexpected inference input",
    m_data: r"Unable to parse 'data'",
    m_deep: r"failed to parse the request JSON buffer",
    m_params: r"Unable to parse '(sequence_\w+|priority|timeout|binary_data_output|"
              r"shared_memory_\w+)'|parameter",
    m_outputs: r"unexpected inference output|Unable to parse '(outputs|name)'",
}


assert set(REACHES) == set(MUTATIONS)


@pytest.mark.parametrize("mutation", list(REACHES), ids=lambda m: m.__name__)
def test_each_mutation_reaches_its_check(mutation):
    """Alone on a valid request, each mutation reaches the check it is about (and that
    check answers 4xx), not only the decoder's first type check."""
    seen = Seen()

    @REACH
    @given(st.data())
    def prop(data):
        # BYTES prefixes only bite on the model with a BYTES input
        config = CONFIGS[1] if mutation is m_bytes_prefix else data.draw(
            st.sampled_from(CONFIGS))
        header, blobs, _ = data.draw(valid_request(config))
        mutation(data.draw, header, blobs)
        body, length = _deep_body(data.draw, header, blobs) if mutation is m_deep \
            else encode(header, blobs)
        seen.add(serve(body, length, config))
        seen.stop_once_reached(REACHES[mutation])

    run_until_reached(prop)
    assert not seen.missing([REACHES[mutation]]), seen.messages[:30]


@given(st.data())
def test_valid_requests_decode_to_exactly_what_was_sent(data):
    config = data.draw(st.sampled_from(CONFIGS))
    header, blobs, expect = data.draw(valid_request(config))
    body, length = encode(header, blobs)
    req = serve(body, length, config)
    assert not isinstance(req, InferError), req
    assert {i.name: decoded_bytes(i.data) for i in req.inputs} == expect
    for item, inp in zip(header["inputs"], req.inputs):
        assert (inp.name, inp.datatype, inp.shape) == (
            item["name"], item["datatype"], item["shape"])
    assert req.id == header.get("id", "")
    if "outputs" in header:
        assert [(o.name, o.binary_data) for o in req.outputs] == [
            (o["name"], o["parameters"]["binary_data"]) for o in header["outputs"]]
    else:
        assert req.outputs is None
    assert req.parameters == header.get("parameters", {})


CLIENT_DATATYPES = st.sampled_from([d for d in DATATYPES if d != "BF16"])


@st.composite
def client_tensors(draw):
    """tritonclient InferInputs over generated arrays, and the raw bytes of each."""
    names = draw(st.lists(st.text("ABCXYZ_0123", min_size=1, max_size=6), min_size=1,
                          max_size=4, unique=True))
    inputs, expect = [], {}
    for name in names:
        datatype = draw(CLIENT_DATATYPES)
        binary = draw(st.booleans())
        shape = draw(st.lists(st.integers(0, 3), max_size=3))
        arr = draw(_arrays(datatype, tuple(shape), not binary))
        inp = httpclient.InferInput(name, shape, datatype)
        inp.set_data_from_numpy(arr, binary_data=binary)
        inputs.append(inp)
        expect[name] = (datatype, shape, raw_bytes(arr, datatype))
    return inputs, expect


@given(tensors=client_tensors(),
       outputs=st.lists(st.tuples(st.text("ABCXYZ_0123", min_size=1, max_size=6),
                                  st.booleans(), st.integers(0, 5)), max_size=3,
                        unique_by=lambda o: o[0]),
       request_id=st.text(max_size=8),
       sequence=st.tuples(st.integers(0, 2**63 - 1) | st.text(min_size=1, max_size=6),
                          st.booleans(), st.booleans()),
       priority=st.integers(0, 2**63 - 1), timeout=st.none() | st.integers(0, 2**63 - 1),
       params=st.dictionaries(st.text("abcdef", min_size=1, max_size=5),
                              st.text(max_size=5) | st.integers(-(2**63), 2**63 - 1)
                              | st.booleans(), max_size=3))
def test_tritonclient_requests_round_trip(tensors, outputs, request_id, sequence, priority,
                                          timeout, params):
    inputs, expect = tensors
    wanted = [httpclient.InferRequestedOutput(n, binary_data=b, class_count=c)
              for n, b, c in outputs]
    sequence_id, start, end = sequence
    body, json_size = httpclient.InferenceServerClient.generate_request_body(
        inputs, outputs=wanted or None, request_id=request_id, sequence_id=sequence_id,
        sequence_start=start, sequence_end=end, priority=priority, timeout=timeout,
        parameters=params or None)
    length = http_codec.parse_header_length(
        None if json_size is None else str(json_size), len(body))
    req = http_codec.decode_infer_request(body, length, "m")
    got = {i.name: (i.datatype, i.shape, decoded_bytes(i.data)) for i in req.inputs}
    assert got == expect
    assert [i.name for i in req.inputs] == [i.name() for i in inputs]
    assert req.id == request_id
    if wanted:
        assert [(o.name, o.binary_data, o.class_count) for o in req.outputs] == outputs
    want_params = dict(params)
    if sequence_id not in (0, ""):
        want_params.update(sequence_id=sequence_id, sequence_start=start,
                           sequence_end=end)
    if priority:
        want_params["priority"] = priority
    if timeout is not None:
        want_params["timeout"] = timeout
    if not wanted:
        want_params["binary_data_output"] = True  # tritonclient asks for binary outputs
    got_params = dict(req.parameters)
    if not wanted and "binary_data_output" not in got_params:
        want_params.pop("binary_data_output")
    assert got_params == want_params


@given(config=st.sampled_from(RAW_CONFIGS), body=st.binary(max_size=64))
def test_raw_requests_carry_the_body_or_a_client_error(config, body):
    out = serve(body, "0", config)
    if isinstance(out, InferError):
        return
    (inp,) = out.inputs
    assert inp.name == config.input[0].name
    if inp.datatype == "BYTES":
        assert decoded_bytes(inp.data) == len(body).to_bytes(4, "little") + body
    else:
        assert decoded_bytes(inp.data) == body


@given(value=st.none() | st.text(max_size=12) | st.integers(-(2**70), 2**70).map(str),
       body_length=st.integers(0, 2**40))
def test_header_length_is_a_number_in_the_body_or_a_client_error(value, body_length):
    out = client_error(http_codec.parse_header_length, value, body_length)
    if not isinstance(out, InferError) and out is not None:
        assert 0 <= out <= body_length


@given(body=st.binary(max_size=300), encoding=st.sampled_from(["gzip", "deflate"]),
       compressed=st.booleans(), cut=st.integers(0, 400), limit=st.integers(0, 400))
def test_decompress_inflates_or_refuses(body, encoding, compressed, cut, limit):
    packed = (gzip.compress(body) if encoding == "gzip" else zlib.compress(body)) \
        if compressed else body
    out = client_error(http_codec.decompress, packed[:cut], encoding, limit)
    if not isinstance(out, InferError):
        assert len(out) <= limit
        if compressed and cut >= len(packed):
            assert out == body


INT_TYPES = ["INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64"]


@given(datatype=st.sampled_from(INT_TYPES),
       values=st.lists(st.integers(-(2**64), 2**64 + 1) | st.sampled_from(HUGE),
                       min_size=1, max_size=6))
def test_json_integers_keep_their_value_or_are_refused(datatype, values):
    """Triton reads JSON integers as int64 (signed types) or uint64 (unsigned ones)
    and keeps the low bytes of what it read; a number its reader refuses (negative for
    an unsigned type, past INT64_MAX for a signed one) is refused, never wrapped."""
    body = json.dumps({"inputs": [{"name": "X", "datatype": datatype,
                                   "shape": [len(values)], "data": values}]}).encode()
    out = client_error(http_codec.decode_infer_request, body, None, "m")
    signed = datatype[0] == "I"
    lo, hi = (-(2**63), 2**63) if signed else (0, 2**64)
    if all(lo <= v < hi for v in values):
        assert not isinstance(out, InferError), out
        bits = NUMPY[datatype].itemsize * 8
        got = np.frombuffer(decoded_bytes(out.inputs[0].data),
                            dtype=np.dtype(f"<u{bits // 8}")).tolist()
        assert got == [v % 2**bits for v in values]
    else:
        assert isinstance(out, InferError)
        assert out.message.startswith(("Unable to parse 'data'",
                                       "failed to parse the request JSON buffer"))
