"""Property-based tests (Hypothesis) of the gRPC request decoder (frontend/grpc_codec.py)
followed by the model checks (frontend/validate.py), as the gRPC server runs them.

Hostile ModelInferRequests (arbitrary bytes, and messages with random inputs, shapes,
typed contents, raw_input_contents counts and lengths, parameters of every kind) are
accepted or refused with InferError(INVALID_ARG), which the server answers with
INVALID_ARGUMENT, as Triton does; nothing else escapes. Requests built by
tritonclient.grpc decode into exactly the tensors, outputs and parameters sent, through
protobuf for small messages and through the splitter for large ones, and the two paths
agree on any message.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from hypothesis import example, given, note, settings
from hypothesis import strategies as st
from tritonclient.grpc import _utils as grpc_utils
from tritonclient.grpc import service_pb2

from frontend import grpc_codec
from frontend.validate import validate_request
from shm.errors import ErrorCode, InferError
from tests.unit.test_properties_http import (
    ANY_CONFIG, CLIENT_DATATYPES, CONFIGS, DATATYPES, HUGE, REACH, Seen, _arrays,
    decoded_bytes, raw_bytes, run_until_reached)

BAD_DATATYPES = ["", "FP8", "fp32", "STRING", "TYPE_INT32"]
INT64 = st.integers(-(2**63), 2**63 - 1)


def refused(fn, *args):
    """fn(*args), or the InferError it raised, which must be INVALID_ARG
    (gRPC INVALID_ARGUMENT); any other exception fails the test."""
    try:
        return fn(*args)
    except InferError as e:
        note(f"refused: {e!r}")
        assert e.code == ErrorCode.INVALID_ARG, e
        assert grpc_codec.grpc_status(e.code).name == "INVALID_ARGUMENT"
        assert e.message
        return e


def serve(data: bytes, config):
    def run():
        req = grpc_codec.decode_infer_request(data)
        validate_request(req, config)
        return req
    return refused(run)


def split_path(data: bytes):
    """The large-message path, whatever the size: split, then parse the rest."""
    def run():
        msg, raws = grpc_codec.parse_infer_request(data)
        return grpc_codec.request_from_message(msg, raws)
    return refused(run)


def protobuf_path(data: bytes):
    def run():
        try:
            msg = service_pb2.ModelInferRequest.FromString(data)
        except Exception:
            raise InferError(ErrorCode.INVALID_ARG, "failed to parse") from None
        return grpc_codec.request_from_message(msg, msg.raw_input_contents)
    return refused(run)


def summary(req):
    if isinstance(req, InferError):
        return "error"
    return (req.id, req.model_name, req.model_version,
            [(i.name, i.datatype, i.shape, None if i.data is None else decoded_bytes(i.data),
              i.parameters) for i in req.inputs],
            None if req.outputs is None else [(o.name, o.class_count, o.parameters)
                                              for o in req.outputs],
            req.parameters)


# ---------------------------------------------------------------------- strategies

param_values = st.one_of(
    st.builds(lambda v: service_pb2.InferParameter(bool_param=v), st.booleans()),
    st.builds(lambda v: service_pb2.InferParameter(int64_param=v), INT64),
    st.builds(lambda v: service_pb2.InferParameter(uint64_param=v),
              st.integers(0, 2**64 - 1)),
    st.builds(lambda v: service_pb2.InferParameter(double_param=v), st.floats()),
    st.builds(lambda v: service_pb2.InferParameter(string_param=v), st.text(max_size=6)),
    st.just(service_pb2.InferParameter()),  # no value at all
)
param_keys = st.sampled_from([
    "sequence_id", "sequence_start", "sequence_end", "priority", "timeout",
    "triton_x", "triton_enable_empty_final_response", "custom", "classification",
    "shared_memory_region", "shared_memory_offset", "shared_memory_byte_size",
    "binary_data_size"])

CONTENTS = {
    "bool_contents": st.booleans(), "int_contents": st.integers(-(2**31), 2**31 - 1),
    "int64_contents": INT64, "uint_contents": st.integers(0, 2**32 - 1),
    "uint64_contents": st.integers(0, 2**64 - 1), "fp32_contents": st.floats(width=32),
    "fp64_contents": st.floats(), "bytes_contents": st.binary(max_size=6)}


@st.composite
def valid_message(draw, config):
    """A ModelInferRequest the model accepts, and {input: raw bytes}."""
    mbs = config.max_batch_size
    batch = draw(st.integers(1, mbs)) if mbs > 0 else None
    msg = service_pb2.ModelInferRequest(model_name=config.name, id=draw(st.text(max_size=6)))
    expect = {}
    specs = [s for s in config.input if not (s.optional and draw(st.booleans()))]
    raw_mode = draw(st.booleans())
    from tests.unit.test_properties_http import _dtype_name, tensor_of
    for spec in draw(st.permutations(specs)):
        datatype = _dtype_name(spec.data_type)
        arr = draw(tensor_of(datatype, tuple(spec.dims), batch, False))
        t = msg.inputs.add(name=spec.name, datatype=datatype, shape=list(arr.shape))
        raw = raw_bytes(arr, datatype)
        if raw_mode or datatype in ("FP16", "BF16", "INT8", "UINT8", "INT16", "UINT16"):
            # typed contents for these types are 32-bit: raw for all, in one message
            raw_mode = True
        expect[spec.name] = (raw, arr)
    if raw_mode:
        for t in msg.inputs:
            msg.raw_input_contents.append(expect[t.name][0])
    else:
        for t in msg.inputs:
            field = {"BOOL": "bool_contents", "INT32": "int_contents",
                     "INT64": "int64_contents", "UINT32": "uint_contents",
                     "UINT64": "uint64_contents", "FP32": "fp32_contents",
                     "FP64": "fp64_contents", "BYTES": "bytes_contents"}[t.datatype]
            getattr(t.contents, field).extend(expect[t.name][1].reshape(-1).tolist())
    return msg, {k: v[0] for k, v in expect.items()}


# each mutation, and the refusal it must reach at least once alone on a valid message
REACHES = {
    "shape": r"unexpected shape for input|has no shape|batch size|All input dimensions",
    "shape_near": r"input byte size mismatch",
    "datatype": r"data-type is|invalid datatype",
    "contents": r"unexpected explicit tensor data|contents field must not be specified",
    "raw_count": r"raw_input_contents",
    "raw_length": r"input byte size mismatch|element byte size",
    "dup": r"already exists in request",
    "drop": r"expected (number of )?\d* ?(and \d+ )?inputs",
    "param": r"invalid value (type )?for|reserved for Triton",
    "input_param": r"invalid value type for|can not be specified without|"
                   r"must be specified along with",
    "outputs": r"unexpected inference output|invalid value type for",
    "bytes_prefix": r"element byte size (indicator )?exceeds the end of the buffer",
    "name": r"unexpected inference input",
}


# Built once: a strategy made inside a composite is built and validated again at every
# draw, which cost as much as drawing.
_HOWS = st.sampled_from(sorted(REACHES))
_SHAPES = st.lists(st.integers(-3, 6) | st.sampled_from(
    [h for h in HUGE if -(2**63) <= h < 2**63]), max_size=4)
_NEAR = st.sampled_from([-1, 1, 2])
_DATATYPE_VALUES = st.sampled_from(DATATYPES + BAD_DATATYPES)
_CONTENT_FIELDS = st.lists(st.sampled_from(sorted(CONTENTS)), min_size=1, max_size=2)
_OUTPUT_NAMES = st.sampled_from(["OUTPUT0", "OUT", "nope", ""])


def mutate(draw, msg, hows=None):
    """One hostile change to a ModelInferRequest, in place."""
    how = draw(st.sampled_from(hows) if hows else _HOWS)
    note(f"mutation: {how}")
    inputs = msg.inputs
    t = inputs[draw(st.integers(0, len(inputs) - 1))] if inputs else msg.inputs.add()
    if how == "shape":
        t.ClearField("shape")
        t.shape.extend(draw(_SHAPES))
    elif how == "shape_near" and t.shape:
        k = draw(st.integers(0, len(t.shape) - 1))
        t.shape[k] = max(t.shape[k] + draw(_NEAR), 0)
    elif how == "datatype":
        t.datatype = draw(_DATATYPE_VALUES)
    elif how == "contents":
        fields = draw(_CONTENT_FIELDS)
        for field in fields:
            getattr(t.contents, field).extend(draw(st.lists(CONTENTS[field], max_size=5)))
    elif how == "raw_count":
        if draw(st.booleans()) and msg.raw_input_contents:
            del msg.raw_input_contents[-1]
        else:
            msg.raw_input_contents.append(draw(st.binary(max_size=16)))
    elif how == "raw_length" and msg.raw_input_contents:
        k = draw(st.integers(0, len(msg.raw_input_contents) - 1))
        raw = msg.raw_input_contents[k]
        msg.raw_input_contents[k] = raw[:draw(st.integers(0, len(raw)))] + draw(
            st.binary(max_size=3))
    elif how == "dup":
        inputs.add().CopyFrom(t)
        if msg.raw_input_contents:
            msg.raw_input_contents.append(msg.raw_input_contents[-1])
    elif how == "drop":
        k = draw(st.integers(0, len(inputs) - 1))
        del inputs[k]
        if k < len(msg.raw_input_contents):  # its data too
            del msg.raw_input_contents[k]
    elif how == "param":
        msg.parameters[draw(param_keys)].CopyFrom(draw(param_values))
    elif how == "input_param":
        t.parameters[draw(param_keys)].CopyFrom(draw(param_values))
    elif how == "outputs":
        out = msg.outputs.add(name=draw(_OUTPUT_NAMES))
        for _ in range(draw(st.integers(0, 2))):
            out.parameters[draw(param_keys)].CopyFrom(draw(param_values))
    elif how == "bytes_prefix":
        for k, raw in enumerate(msg.raw_input_contents):
            if k < len(inputs) and inputs[k].datatype == "BYTES" and draw(st.booleans()):
                msg.raw_input_contents[k] = raw + draw(st.binary(min_size=1, max_size=3))
                break
            if k < len(inputs) and inputs[k].datatype == "BYTES" and len(raw) >= 4:
                blob = bytearray(raw)
                at = draw(st.integers(0, len(blob) - 4))
                blob[at:at + 4] = draw(st.integers(0, 2**32 - 1)).to_bytes(4, "little")
                msg.raw_input_contents[k] = bytes(blob)
                break
    elif how == "name":
        t.name = draw(st.text(max_size=5))


@st.composite
def hostile_message(draw):
    config = draw(ANY_CONFIG)
    msg, _ = draw(valid_message(config))
    for _ in range(draw(st.integers(1, 2))):
        mutate(draw, msg)
    # map fields (parameters) in key order: protobuf leaves their order unspecified, and
    # where a tear or a flipped bit lands must not follow it, or a failure would not
    # reproduce
    data = msg.SerializeToString(deterministic=True)
    if draw(st.integers(0, 9)) == 5:  # torn or bit-flipped on the wire
        data = bytearray(data[:draw(st.integers(0, len(data)))])
        if data:
            at = draw(st.integers(0, len(data) - 1))
            data[at] ^= draw(st.integers(1, 255))
        data = bytes(data)
    return config, data


# ----------------------------------------------------------------------- properties


def test_arbitrary_bytes_are_refused_with_invalid_argument():
    seen = Seen()

    @given(data=st.binary(max_size=300), config=st.sampled_from(CONFIGS))
    def prop(data, config):
        seen.add(serve(data, config))
        assert summary(split_path(data)) == summary(protobuf_path(data))

    prop()
    assert not seen.missing(["failed to parse the ModelInferRequest message"])


def test_hostile_messages_are_refused_with_invalid_argument():
    seen = Seen()

    @settings(max_examples=3 * settings.default.max_examples)
    @given(hostile_message())
    def prop(case):
        config, data = case
        seen.add(serve(data, config))
        # the large-message path (split, then protobuf) says what protobuf says
        assert summary(split_path(data)) == summary(protobuf_path(data))

    prop()
    # which check each mutation reaches is test_each_mutation_reaches_its_check's
    assert not seen.missing([r"failed to parse the ModelInferRequest message",
                             r"\[request id: "]), seen.messages[:30]
    assert seen.accepted


@pytest.mark.parametrize("how", sorted(REACHES))
def test_each_mutation_reaches_its_check(how):
    """Alone on a valid message, each mutation reaches the check it is about (and that
    check answers INVALID_ARGUMENT), not only the decoder's door."""
    seen = Seen()

    @REACH
    @given(st.data())
    def prop(data):
        # BYTES prefixes only bite on the model with a BYTES input
        config = CONFIGS[1] if how == "bytes_prefix" else data.draw(
            st.sampled_from(CONFIGS))
        msg, _ = data.draw(valid_message(config))
        mutate(data.draw, msg, [how])
        seen.add(serve(msg.SerializeToString(), config))
        seen.stop_once_reached(REACHES[how])

    run_until_reached(prop)
    assert not seen.missing([REACHES[how]]), seen.messages[:30]


@given(st.data())
def test_valid_messages_decode_to_exactly_what_was_sent(data):
    config = data.draw(st.sampled_from(CONFIGS))
    msg, expect = data.draw(valid_message(config))
    req = serve(msg.SerializeToString(), config)
    assert not isinstance(req, InferError), req
    assert {i.name: decoded_bytes(i.data) for i in req.inputs} == expect
    assert [(i.name, i.datatype, i.shape) for i in req.inputs] == [
        (t.name, t.datatype, list(t.shape)) for t in msg.inputs]


@st.composite
def client_inputs(draw):
    names = draw(st.lists(st.text("ABCXYZ_0123", min_size=1, max_size=6), min_size=1,
                          max_size=4, unique=True))
    inputs, expect = [], {}
    for name in names:
        datatype = draw(CLIENT_DATATYPES)
        shape = draw(st.lists(st.integers(0, 3), max_size=3))
        arr = draw(_arrays(datatype, tuple(shape), False))
        inp = grpcclient.InferInput(name, shape, datatype)
        inp.set_data_from_numpy(arr)
        inputs.append(inp)
        expect[name] = (datatype, shape, raw_bytes(arr, datatype))
    if draw(st.booleans()):
        # one large input: the message takes the splitting path
        seed = draw(st.integers(0, 2**32 - 1))
        big = np.random.default_rng(seed).integers(0, 256, grpc_codec.SPLIT_THRESHOLD,
                                                   dtype=np.uint8)
        inp = grpcclient.InferInput("BIG", [big.size], "UINT8")
        inp.set_data_from_numpy(big)
        inputs.insert(draw(st.integers(0, len(inputs))), inp)
        expect["BIG"] = ("UINT8", [big.size], big.tobytes())
    return inputs, expect


@given(tensors=client_inputs(),
       outputs=st.lists(st.tuples(st.text("ABCXYZ_0123", min_size=1, max_size=6),
                                  st.integers(0, 5)), max_size=3, unique_by=lambda o: o[0]),
       request_id=st.text(max_size=8), version=st.sampled_from(["", "1", "17"]),
       sequence=st.tuples(st.integers(0, 2**63 - 1) | st.text(min_size=1, max_size=6),
                          st.booleans(), st.booleans()),
       priority=st.integers(0, 2**63 - 1), timeout=st.none() | st.integers(0, 2**63 - 1),
       params=st.dictionaries(st.text("abcdef", min_size=1, max_size=5),
                              st.text(max_size=5) | INT64 | st.booleans(), max_size=3))
def test_tritonclient_messages_round_trip(tensors, outputs, request_id, version, sequence,
                                         priority, timeout, params):
    inputs, expect = tensors
    wanted = [grpcclient.InferRequestedOutput(n, class_count=c) for n, c in outputs]
    sequence_id, start, end = sequence
    msg = grpc_utils._get_inference_request(
        model_name="m", inputs=inputs, model_version=version, request_id=request_id,
        outputs=wanted or None, sequence_id=sequence_id, sequence_start=start,
        sequence_end=end, priority=priority, timeout=timeout, parameters=params or None)
    data = msg.SerializeToString()
    req = grpc_codec.decode_infer_request(data)
    assert {i.name: (i.datatype, i.shape, decoded_bytes(i.data))
            for i in req.inputs} == expect
    assert [i.name for i in req.inputs] == [i.name() for i in inputs]
    assert (req.model_name, req.model_version, req.id) == ("m", version, request_id)
    if wanted:
        assert [(o.name, o.class_count) for o in req.outputs] == outputs
    else:
        assert req.outputs is None
    want = dict(params)
    if sequence_id not in (0, ""):
        want.update(sequence_id=sequence_id, sequence_start=start, sequence_end=end)
    if priority:
        want["priority"] = priority
    if timeout is not None:
        want["timeout"] = timeout
    assert req.parameters == want
    assert summary(split_path(data)) == summary(protobuf_path(data))


# ------------------------------------------------------- the walker against protobuf

FIELD_NUMBERS = [1, 2, 3, 4, 5, 6, 7, 7, 8, 15, 16, 100, 2047, 2048, 2**29 - 1]


def _varint(n: int) -> bytes:
    return grpc_codec._varint_bytes(n)


@st.composite
def wire_field(draw, valid: bool, depth: int = 0):
    """One field on the wire. `valid`: one protobuf reads (numbers from 1, wire types
    0, 1, 2, 5 and closed groups, true lengths); else right or subtly wrong: field
    number 0, any of the 8 wire types, varints overlong or cut, lengths that lie."""
    number = draw(_FIELD_NUMBER[valid])
    wire = draw(_WIRE_TYPE[valid])
    key = _varint(number << 3 | wire)
    if len(key) < 5 and draw(st.integers(0, 15)) == 0:  # overlong (protobuf: up to 5)
        key = bytes(b | 0x80 for b in key) + b"\x00"
    if wire == 0:
        value = _varint(draw(st.integers(0, 2**64 - 1)))
        if not valid and draw(st.integers(0, 15)) == 0:
            value = b"\xff" * draw(st.integers(9, 11)) + b"\x01"
        return key + value
    if wire == 1:
        return key + draw(st.binary(min_size=8, max_size=8))
    if wire == 5:
        return key + draw(st.binary(min_size=4, max_size=4))
    if wire == 2:
        payload = draw(_payload(valid, depth))
        lie = 0 if valid else draw(_LIES)
        return key + _varint(max(len(payload) + lie, 0)) + payload
    if wire == 3 and depth < 3:  # a group, closed by its own end tag (or not)
        inner = draw(_fields(valid, depth + 1))
        if draw(st.booleans()):  # raw contents inside a group are not raw contents
            inner.insert(draw(st.integers(0, len(inner))), b"\x3a\x01x")
        end = number if valid or draw(st.integers(0, 5)) else draw(_FIELD_NUMBER[True])
        return key + b"".join(inner) + _varint(end << 3 | 4)
    if wire == 3:
        return key + _varint(number << 3 | 4) if valid else key
    return key  # an end-group tag, or wire types 6 and 7: nothing follows


# Built once (a strategy made inside a composite is built and validated at every draw).
_FIELD_NUMBER = {True: st.sampled_from(FIELD_NUMBERS),
                 False: st.sampled_from([0] + FIELD_NUMBERS)}
_WIRE_TYPE = {True: st.sampled_from([0, 1, 2, 3, 5]), False: st.sampled_from(range(8))}
_LIES = st.sampled_from([0, 0, 0, 0, 1, -1, 2**31])


@functools.lru_cache(maxsize=None)
def _fields(valid: bool, depth: int):
    return st.lists(wire_field(valid, depth), max_size=3)


@functools.lru_cache(maxsize=None)
def _payload(valid: bool, depth: int):
    return st.one_of(st.binary(max_size=12),
                     st.builds(b"".join, _fields(valid, depth + 1))
                     if depth < 2 else st.binary(max_size=4))


_TOP_FIELDS = {v: st.lists(wire_field(v), max_size=8) for v in (True, False)}


@st.composite
def wire_message(draw):
    """A message of fields that protobuf reads, or of fields each of which may not
    be; raw_input_contents among them; sometimes cut short."""
    valid = draw(st.booleans())
    fields = draw(_TOP_FIELDS[valid])
    raws = draw(st.lists(st.binary(max_size=20), max_size=3))
    for raw in raws:  # raw_input_contents, anywhere among the others
        fields.insert(draw(st.integers(0, len(fields))), b"\x3a" + _varint(len(raw)) + raw)
    data = b"".join(fields)
    if data and draw(st.integers(0, 5)) == 0:  # cut short
        data = data[:draw(st.integers(0, len(data) - 1))]
    return data


def _protobuf_answer(data: bytes):
    try:
        msg = service_pb2.ModelInferRequest.FromString(data)
    except Exception:
        return "refused"
    raws = list(msg.raw_input_contents)
    msg.ClearField("raw_input_contents")
    return raws, msg.SerializeToString(deterministic=True)


def _walker_answer(data: bytes):
    try:
        msg, raws = grpc_codec.parse_infer_request(data)
    except InferError as e:
        assert e.code == ErrorCode.INVALID_ARG
        return "refused"
    raws = [bytes(r) for r in raws]
    msg = service_pb2.ModelInferRequest.FromString(msg.SerializeToString())
    msg.ClearField("raw_input_contents")  # present when protobuf parsed the whole
    return raws, msg.SerializeToString(deterministic=True)


def test_the_raw_contents_walker_answers_as_protobuf():
    """parse_infer_request (the walker, then protobuf on what is left, or on all of
    it where the walker is unsure) accepts exactly what protobuf accepts, with the
    same raw_input_contents and the same other fields (unknown ones included)."""
    seen = Seen()

    @settings(max_examples=2 * settings.default.max_examples)
    @given(st.one_of(wire_message(), st.binary(max_size=64)))
    @example(b";:\x01x<")  # raw contents inside a group 7: not raw contents
    @example(bytes(8))  # field number 0
    def prop(data):
        want = _protobuf_answer(data)
        assert _walker_answer(data) == want
        # a prefix the walker calls malformed is one no continuation mends
        if any(grpc_codec.malformed_prefix(data[:k]) for k in range(len(data) + 1)):
            assert want == "refused"
        seen.add(InferError(ErrorCode.INVALID_ARG, "refused") if want == "refused"
                 else None)
        # and the large-message path of the decoder says the same
        big = data + (b"\x3a" + _varint(grpc_codec.SPLIT_THRESHOLD)
                      + bytes(grpc_codec.SPLIT_THRESHOLD))
        assert (_walker_answer(big) == "refused") == (_protobuf_answer(big) == "refused")

    prop()
    assert seen.accepted and not seen.missing(["refused"])
