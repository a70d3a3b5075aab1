"""The python backend's user API (workers.python_backend.pb_utils), checked against the
rules of Triton's triton_python_backend_utils: no server, no processes."""

import asyncio
import json
import logging
import struct

import numpy as np
import pytest

from shm import dlpack
from shm.errors import ErrorCode
from workers.python_backend import pb_utils as pb

# datatype, TRITONSERVER_DataType value, config type name, numpy type
TYPES = [
    ("BOOL", 1, "TYPE_BOOL", np.bool_),
    ("UINT8", 2, "TYPE_UINT8", np.uint8),
    ("UINT16", 3, "TYPE_UINT16", np.uint16),
    ("UINT32", 4, "TYPE_UINT32", np.uint32),
    ("UINT64", 5, "TYPE_UINT64", np.uint64),
    ("INT8", 6, "TYPE_INT8", np.int8),
    ("INT16", 7, "TYPE_INT16", np.int16),
    ("INT32", 8, "TYPE_INT32", np.int32),
    ("INT64", 9, "TYPE_INT64", np.int64),
    ("FP16", 10, "TYPE_FP16", np.float16),
    ("FP32", 11, "TYPE_FP32", np.float32),
    ("FP64", 12, "TYPE_FP64", np.float64),
    ("BYTES", 13, "TYPE_STRING", np.object_),
]


def request(inputs, **kw):
    return pb.InferenceRequest._from_server(inputs=inputs, **kw)


# -- datatypes ------------------------------------------------------------------

@pytest.mark.parametrize("datatype,enum_value,config_name,np_type", TYPES)
def test_datatype_tables(datatype, enum_value, config_name, np_type):
    assert pb.triton_to_numpy_type(enum_value) is np_type
    assert pb.numpy_to_triton_type(np_type) == enum_value
    assert pb.numpy_to_triton_type(np.dtype(np_type)) == enum_value
    expected = bool if config_name == "TYPE_BOOL" else np_type  # as Triton's table has it
    assert pb.triton_string_to_numpy(config_name) is expected
    if datatype == "BYTES":
        array = np.array([b"a", b"bc"], dtype=object)
    else:
        array = np.zeros((2, 3), dtype=np_type)
    tensor = pb.Tensor("t", array)
    assert tensor.triton_dtype() == enum_value
    assert tensor._datatype == datatype


def test_datatype_edge_cases():
    assert pb.numpy_to_triton_type(np.bytes_) == 13
    assert pb.numpy_to_triton_type(np.dtype("S7")) == 13
    assert pb.numpy_to_triton_type(np.dtype("U3")) is None  # Triton has no str arrays
    assert pb.numpy_to_triton_type(np.complex64) is None
    assert pb.numpy_to_triton_type(np.dtype(">f4")) is None
    assert pb.triton_to_numpy_type(14) is None  # BF16: numpy has no such type
    assert pb.triton_to_numpy_type(0) is None
    with pytest.raises(KeyError):
        pb.triton_string_to_numpy("TYPE_BF16")
    assert set(pb.TRITON_STRING_TO_NUMPY) == {t[2] for t in TYPES}


# -- BYTES ----------------------------------------------------------------------

def test_bytes_round_trip_and_wire_layout():
    array = np.array([[b"ab", "\u00e9"], [b"", 7]], dtype=object)
    wire = pb.serialize_byte_tensor(array)
    assert wire == (struct.pack("<I", 2) + b"ab" + struct.pack("<I", 2) + "\u00e9".encode()
                    + struct.pack("<I", 0) + struct.pack("<I", 1) + b"7")
    back = pb.deserialize_bytes_tensor(wire)
    assert back.dtype == np.object_ and back.shape == (4,)
    assert back.tolist() == [b"ab", "\u00e9".encode(), b"", b"7"]
    assert pb.deserialize_bytes_tensor(np.frombuffer(wire, np.uint8)).tolist() == back.tolist()


def test_bytes_serialization_of_bytes_arrays_empty_and_other_dtypes():
    fixed = np.array([b"xy", b"z"], dtype="S2")
    assert pb.deserialize_bytes_tensor(pb.serialize_byte_tensor(fixed)).tolist() == [b"xy", b"z"]
    assert pb.serialize_byte_tensor(np.array([], dtype=object)) == b""
    assert pb.serialize_byte_tensor(np.zeros(3, np.float32)) is None
    assert pb.deserialize_bytes_tensor(b"").shape == (0,)


def test_bytes_tensors_accept_object_and_bytes_arrays_but_not_str_arrays():
    objects = np.array(["a", b"b"], dtype=object)
    assert pb.Tensor("s", objects).as_numpy() is objects
    assert pb.Tensor("s", np.array([b"a"], dtype="S1")).triton_dtype() == 13
    with pytest.raises(pb.TritonModelException, match="dtype=object"):
        pb.Tensor("s", np.array(["a"]))


# -- Tensor ---------------------------------------------------------------------

def test_tensor_basics_and_no_copy():
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    tensor = pb.Tensor("INPUT0", array)
    assert tensor.name() == "INPUT0"
    assert tensor.as_numpy() is array
    assert tensor.shape() == [3, 4] and isinstance(tensor.shape(), list)
    assert tensor.is_cpu()
    assert tensor._host_array() is array
    assert "INPUT0" in repr(tensor)


def test_tensor_makes_non_contiguous_arrays_contiguous():
    base = np.arange(12, dtype=np.int32).reshape(3, 4)
    tensor = pb.Tensor("t", base[:, ::2])
    assert tensor.as_numpy().flags.c_contiguous
    assert tensor.as_numpy().tolist() == base[:, ::2].tolist()


def test_tensor_converts_lists_and_validates():
    assert pb.Tensor("t", [1, 2, 3]).as_numpy().tolist() == [1, 2, 3]
    with pytest.raises(pb.TritonModelException, match="empty string"):
        pb.Tensor("", np.zeros(1))
    with pytest.raises(TypeError):
        pb.Tensor(3, np.zeros(1))
    for bad in (np.zeros(2, np.complex64), np.zeros(2, "datetime64[s]"),
                np.zeros(2, np.dtype(">i4"))):
        with pytest.raises(pb.TritonModelException, match="not supported"):
            pb.Tensor("t", bad)


def test_tensor_from_server_wraps_without_copy():
    words = np.array([0x3F80, 0x4000], dtype=np.uint16)
    bf16 = pb.Tensor._from_server("b", "BF16", words)
    assert bf16.triton_dtype() == 14 and bf16.shape() == [2]
    assert bf16._host_array() is words
    with pytest.raises(pb.TritonModelException, match="BF16"):
        bf16.as_numpy()


# -- DLPack ---------------------------------------------------------------------

def test_to_dlpack_round_trip_with_numpy_shares_memory():
    array = np.arange(6, dtype=np.float64).reshape(2, 3)
    tensor = pb.Tensor("t", array)
    via_capsule = np.from_dlpack(pb._CapsuleSource(tensor.to_dlpack()))
    via_protocol = np.from_dlpack(tensor)
    for out in (via_capsule, via_protocol):
        assert out.shape == (2, 3) and out.dtype == np.float64
        assert np.shares_memory(out, array)
    assert tensor.__dlpack_device__() == (1, 0)


def test_from_dlpack_accepts_objects_and_capsules_without_copy():
    array = np.arange(4, dtype=np.int16)
    from_object = pb.Tensor.from_dlpack("a", array)
    from_capsule = pb.Tensor.from_dlpack("b", array.__dlpack__())
    for tensor in (from_object, from_capsule):
        assert tensor.triton_dtype() == 7 and tensor.shape() == [4]
        assert np.shares_memory(tensor.as_numpy(), array)
    again = pb.Tensor.from_dlpack("c", from_object)  # a Tensor is a DLPack producer too
    assert np.shares_memory(again.as_numpy(), array)
    booleans = pb.Tensor.from_dlpack("d", np.array([True, False]))
    assert booleans.triton_dtype() == 1 and booleans.as_numpy().tolist() == [True, False]


def test_from_dlpack_rejections():
    with pytest.raises(pb.TritonModelException, match="not contiguous"):
        pb.Tensor.from_dlpack("t", np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2])
    with pytest.raises(pb.TritonModelException, match="not supported"):
        pb.Tensor.from_dlpack("t", [1, 2])
    with pytest.raises(pb.TritonModelException, match="not supported"):
        pb.Tensor.from_dlpack("t", np.zeros(2, np.complex64))
    capsule = np.zeros(2, np.float32).__dlpack__()
    pb.Tensor.from_dlpack("t", capsule)
    with pytest.raises(pb.TritonModelException, match="already consumed"):
        pb.Tensor.from_dlpack("t", capsule)
    with pytest.raises(pb.TritonModelException, match="empty string"):
        pb.Tensor.from_dlpack("", np.zeros(1))
    with pytest.raises(pb.TritonModelException, match="string tensors"):
        pb.Tensor("s", np.array([b"x"], dtype=object)).to_dlpack()


def test_unit_dimensions_do_not_break_contiguity():
    assert pb._is_c_contiguous((3, 1), (1, 99))
    assert not pb._is_c_contiguous((3, 2), (1, 3))
    assert pb._is_c_contiguous((0, 5), (7, 7))


def test_bf16_round_trips_through_dlpack_only():
    words = np.array([[0x3F80, 0xBF80, 0x4000]], dtype=np.uint16)  # 1.0, -1.0, 2.0
    tensor = pb.Tensor._from_server("b", "BF16", words)
    info = pb._dl_describe(tensor.to_dlpack())
    assert (info.code, info.bits, info.lanes, info.shape) == (4, 16, 1, (1, 3))
    back = pb.Tensor.from_dlpack("c", tensor)
    assert back.triton_dtype() == 14 and back.shape() == [1, 3]
    assert np.shares_memory(back._host_array(), words)
    assert back._host_array().tolist() == words.tolist()
    with pytest.raises(pb.TritonModelException, match="to_dlpack"):
        back.as_numpy()


def test_device_tensors_are_kept_as_device_memory():
    keep = object()
    capsule = dlpack.export(0xDEAD00, (2, 2), "FP32", (2, 1), keep)  # CUDA device 1
    tensor = pb.Tensor.from_dlpack("g", capsule)
    assert not tensor.is_cpu()
    assert tensor.shape() == [2, 2] and tensor.triton_dtype() == 11
    assert tensor.__dlpack_device__() == (2, 1)
    with pytest.raises(pb.TritonModelException, match="GPU"):
        tensor.as_numpy()
    with pytest.raises(pb.TritonModelException, match="device memory"):
        tensor._host_array()
    info = pb._dl_describe(tensor.to_dlpack())
    assert (info.data, info.device, info.shape) == (0xDEAD00, (2, 1), (2, 2))


def test_dlpack_exports_are_released():
    before = set(dlpack._exported)
    tensor = pb.Tensor("t", np.ones(3, np.float32))
    unused = tensor.to_dlpack()
    consumed = np.from_dlpack(tensor)
    imported = pb.Tensor.from_dlpack("b", pb.Tensor._from_server("b", "BF16",
                                                                  np.ones(2, np.uint16)))
    ours = set(dlpack._exported) - before
    assert len(ours) == 3
    del unused, consumed, imported  # no cycles: refcounting alone releases them
    assert not ours & set(dlpack._exported)


# -- errors ---------------------------------------------------------------------

def test_triton_error_codes_match_error_code():
    names = ["UNKNOWN", "INTERNAL", "NOT_FOUND", "INVALID_ARG", "UNAVAILABLE",
             "UNSUPPORTED", "ALREADY_EXISTS", "CANCELLED"]
    for value, name in enumerate(names):  # TRITONSERVER_Error_Code order
        assert getattr(pb.TritonError, name) == value == ErrorCode[name]
    error = pb.TritonError("nope")
    assert error.message() == "nope" and error.code() == pb.TritonError.INTERNAL
    error = pb.TritonError("gone", pb.TritonError.NOT_FOUND)
    assert error.code() is ErrorCode.NOT_FOUND and str(error) == "gone"
    with pytest.raises(ValueError):
        pb.TritonError("x", 42)
    with pytest.raises(TypeError):
        pb.TritonError(None)
    assert issubclass(pb.TritonModelException, Exception)


# -- responses --------------------------------------------------------------------

def test_inference_response_outputs_errors_and_parameters():
    out = pb.Tensor("OUT", np.zeros(2, np.float32))
    response = pb.InferenceResponse(output_tensors=[out], parameters={"n": 1, "ok": True})
    assert response.output_tensors() == [out] and not response.has_error()
    assert response.error() is None
    assert json.loads(response.parameters()) == {"n": 1, "ok": True}
    assert pb.get_output_tensor_by_name(response, "OUT") is out
    assert pb.get_output_tensor_by_name(response, "OTHER") is None

    failed = pb.InferenceResponse(error=pb.TritonError("bad", pb.TritonError.INVALID_ARG))
    assert failed.has_error() and failed.output_tensors() == []
    assert failed.error().message() == "bad" and failed.error().code() == 3
    assert pb.InferenceResponse().parameters() == "{}"

    with pytest.raises(TypeError):
        pb.InferenceResponse(output_tensors=[np.zeros(1)])
    with pytest.raises(TypeError):
        pb.InferenceResponse(error="bad")
    with pytest.raises(pb.TritonModelException, match="bool/int/str"):
        pb.InferenceResponse(parameters={"x": 1.5})


# -- requests ---------------------------------------------------------------------

def test_server_request_accessors():
    x = pb.Tensor("X", np.ones(2, np.float32))
    req = request([x], request_id="r1", correlation_id="seq-7",
                  requested_output_names=["A", "B"],
                  flags=pb.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
                  parameters_json='{"k": "v"}', model_name="m", model_version=2, timeout=500)
    assert req.inputs() == [x] and req.request_id() == "r1"
    assert req.correlation_id() == "seq-7" and req.flags() == 1
    assert req.requested_output_names() == {"A", "B"}
    assert json.loads(req.parameters()) == {"k": "v"} and req.timeout() == 500
    assert not req.is_cancelled() and req.trace().get_context() is None
    assert pb.get_input_tensor_by_name(req, "X") is x
    assert pb.get_input_tensor_by_name(req, "Y") is None
    req.set_flags(3)
    assert req.flags() == 3
    assert request([], correlation_id=9).correlation_id() == 9
    assert request([], is_cancelled=lambda: True).is_cancelled()


def test_release_flags():
    req = request([])
    assert req._release_flags == pb.TRITONSERVER_REQUEST_RELEASE_ALL
    req.set_release_flags(pb.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
    assert req._release_flags == 2
    with pytest.raises(pb.TritonModelException):
        req.set_release_flags(4)


def test_bls_request_constructor_validates_like_triton():
    x = pb.Tensor("X", np.ones(1, np.int32))
    req = pb.InferenceRequest(model_name="other", inputs=[x], requested_output_names=["Y"],
                              correlation_id=4, parameters={"a": "b"},
                              preferred_memory=pb.PreferredMemory(pb.TRITONSERVER_MEMORY_CPU))
    assert req.inputs() == [x] and req.requested_output_names() == {"Y"}
    assert req.request_id() == "" and req.flags() == 0 and req.timeout() == 0
    assert json.loads(req.parameters()) == {"a": "b"}
    assert pb.InferenceRequest(model_name="m", inputs=[], requested_output_names=[],
                               correlation_id="c").correlation_id() == "c"
    with pytest.raises(TypeError, match="model_name"):
        pb.InferenceRequest(inputs=[], requested_output_names=[])
    with pytest.raises(TypeError, match="inputs"):
        pb.InferenceRequest(model_name="m", requested_output_names=[])
    with pytest.raises(pb.TritonModelException, match="Correlation ID"):
        pb.InferenceRequest(model_name="m", inputs=[], requested_output_names=[],
                            correlation_id=1.5)
    with pytest.raises(pb.TritonModelException, match="keys"):
        pb.InferenceRequest(model_name="m", inputs=[], requested_output_names=[],
                            parameters={1: "x"})
    with pytest.raises(TypeError):
        pb.InferenceRequest(model_name="m", inputs=[np.zeros(1)], requested_output_names=[])


def test_bls_is_not_supported_until_the_worker_sets_a_hook(monkeypatch):
    req = pb.InferenceRequest(model_name="m", inputs=[], requested_output_names=["Y"])
    with pytest.raises(pb.TritonModelException, match="BLS is not supported yet"):
        req.exec()
    with pytest.raises(pb.TritonModelException, match="BLS is not supported yet"):
        req.async_exec()

    calls = []

    def executor(r, decoupled):
        calls.append((r, decoupled))
        return pb.InferenceResponse()

    monkeypatch.setattr(pb, "_bls_executor", executor)
    assert isinstance(req.exec(), pb.InferenceResponse)

    async def run():
        return await req.async_exec(decoupled=True)

    assert isinstance(asyncio.run(run()), pb.InferenceResponse)
    assert calls == [(req, False), (req, True)]


def test_response_sender_not_available_without_a_transport():
    with pytest.raises(pb.TritonModelException, match="not supported yet"):
        request([]).get_response_sender()


def test_decoupled_response_sender():
    sent = []
    req = request([], decoupled=True, send_response=lambda r, f: sent.append((r, f)),
                  is_cancelled=lambda: False)
    sender = req.get_response_sender()
    assert req.get_response_sender() is sender and not sender.is_cancelled()
    first, second = pb.InferenceResponse(), pb.InferenceResponse()
    sender.send(first)
    sender.send(second)
    sender.send(flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    assert sent == [(first, 0), (second, 0), (None, 1)]
    assert sender._is_closed()
    with pytest.raises(pb.TritonModelException, match="closed"):
        sender.send(pb.InferenceResponse())
    with pytest.raises(pb.TritonModelException, match="Unsupported flag"):
        request([], decoupled=True, send_response=print).get_response_sender().send(
            pb.InferenceResponse(), flags=4)
    with pytest.raises(pb.TritonModelException, match="must be provided"):
        request([], decoupled=True, send_response=print).get_response_sender().send()


def test_non_decoupled_response_sender_sends_one_response():
    sent = []
    sender = request([], send_response=lambda r, f: sent.append(f)).get_response_sender()
    with pytest.raises(pb.TritonModelException, match="before sending a response"):
        sender.send(flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    sender.send(pb.InferenceResponse())
    with pytest.raises(pb.TritonModelException, match="more than one"):
        sender.send(pb.InferenceResponse())
    sender.send(flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    assert sent == [0, 1]


# -- model config -----------------------------------------------------------------

CONFIG = {
    "name": "add_sub", "max_batch_size": 8,
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]},
              {"name": "INPUT1", "data_type": "TYPE_INVALID", "dims": []}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
}


def test_config_lookups():
    assert pb.get_input_config_by_name(CONFIG, "INPUT0")["dims"] == [4]
    assert pb.get_input_config_by_name(CONFIG, "OUTPUT0") is None
    assert pb.get_output_config_by_name(CONFIG, "OUTPUT0")["data_type"] == "TYPE_FP32"
    assert pb.get_output_config_by_name({"name": "x"}, "OUTPUT0") is None
    assert not pb.using_decoupled_model_transaction_policy(CONFIG)
    assert pb.using_decoupled_model_transaction_policy(
        {"model_transaction_policy": {"decoupled": True}})


def test_model_config_from_json_or_dict():
    from_json = pb.ModelConfig(json.dumps(CONFIG))
    from_dict = pb.ModelConfig(CONFIG)
    assert from_json.as_dict() == from_dict.as_dict() == CONFIG
    from_dict.as_dict()["input"].clear()
    assert len(CONFIG["input"]) == 2  # the caller's dict is not shared
    bare = pb.ModelConfig({"name": "m"}).as_dict()
    assert bare["max_batch_size"] == 0 and bare["input"] == [] and bare["output"] == []
    with pytest.raises(TypeError):
        pb.ModelConfig(42)


def test_set_max_batch_size_may_only_grow():
    config = pb.ModelConfig(CONFIG)
    config.set_max_batch_size(16)
    assert config.as_dict()["max_batch_size"] == 16
    with pytest.raises(ValueError, match="max_batch_size 16"):
        config.set_max_batch_size(4)


def test_set_dynamic_batching():
    config = pb.ModelConfig(CONFIG)
    config.set_dynamic_batching()
    assert config.as_dict()["dynamic_batching"] == {}
    config.as_dict()["dynamic_batching"] = {"max_queue_delay_microseconds": 5}
    config.set_dynamic_batching()  # kept as configured
    assert config.as_dict()["dynamic_batching"] == {"max_queue_delay_microseconds": 5}
    with pytest.raises(ValueError, match="sequence_batching"):
        pb.ModelConfig({**CONFIG, "sequence_batching": {}}).set_dynamic_batching()


def test_add_input_adds_completes_and_rejects_conflicts():
    config = pb.ModelConfig(CONFIG)
    config.add_input({"name": "INPUT2", "data_type": "TYPE_INT32", "dims": [1],
                      "optional": True})
    config.add_input({"name": "INPUT1", "data_type": "TYPE_FP32", "dims": [4]})
    config.add_input({"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]})
    inputs = {i["name"]: i for i in config.as_dict()["input"]}
    assert inputs["INPUT1"] == {"name": "INPUT1", "data_type": "TYPE_FP32", "dims": [4]}
    assert inputs["INPUT2"]["optional"] is True and len(inputs) == 3
    with pytest.raises(ValueError, match="expects datatype TYPE_FP32"):
        config.add_input({"name": "INPUT0", "data_type": "TYPE_INT8", "dims": [4]})
    with pytest.raises(ValueError, match="dims"):
        config.add_input({"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [5]})
    with pytest.raises(ValueError, match="optional"):
        config.add_input({"name": "INPUT2", "data_type": "TYPE_INT32", "dims": [1],
                          "optional": False})
    with pytest.raises(ValueError, match="property other than"):
        config.add_input({"name": "X", "data_type": "TYPE_FP32", "dims": [1], "format": 1})
    with pytest.raises(ValueError, match="missing 'dims'"):
        config.add_input({"name": "X", "data_type": "TYPE_FP32"})
    with pytest.raises(ValueError, match="missing 'name'"):
        config.add_input({"data_type": "TYPE_FP32", "dims": [1]})


def test_add_output():
    config = pb.ModelConfig(CONFIG)
    config.add_output({"name": "OUTPUT1", "data_type": "TYPE_FP32", "dims": [4]})
    assert [o["name"] for o in config.as_dict()["output"]] == ["OUTPUT0", "OUTPUT1"]
    with pytest.raises(ValueError, match="property other than"):
        config.add_output({"name": "OUTPUT2", "data_type": "TYPE_FP32", "dims": [4],
                           "optional": True})
    with pytest.raises(ValueError, match="expects datatype"):
        config.add_output({"name": "OUTPUT0", "data_type": "TYPE_INT64", "dims": [4]})


def test_set_model_transaction_policy():
    config = pb.ModelConfig(CONFIG)
    config.set_model_transaction_policy({"decoupled": True})
    assert config.as_dict()["model_transaction_policy"] == {"decoupled": True}
    config.set_model_transaction_policy({"decoupled": True})
    with pytest.raises(ValueError, match="already set"):
        config.set_model_transaction_policy({"decoupled": False})
    with pytest.raises(ValueError, match="other than 'decoupled'"):
        config.set_model_transaction_policy({"streaming": True})


# -- logging, metrics, model control --------------------------------------------

def test_logger_levels_and_caller_location(caplog):
    caplog.set_level(logging.INFO, logger="shmserve.model")
    pb.Logger.log_info("info")
    pb.Logger.log_warn("warn")
    pb.Logger.log_error("error")
    pb.Logger.log("explicit", pb.Logger.WARNING)
    pb.Logger.log_verbose("hidden")  # VERBOSE is DEBUG: off at INFO
    records = [r for r in caplog.records if r.name == "shmserve.model"]
    assert [(r.levelno, r.getMessage()) for r in records] == [
        (logging.INFO, "info"), (logging.WARNING, "warn"), (logging.ERROR, "error"),
        (logging.WARNING, "explicit")]
    assert all(r.filename == "test_pb_utils.py" for r in records)
    assert records[0].funcName == "test_logger_levels_and_caller_location"
    caplog.set_level(logging.DEBUG, logger="shmserve.model")
    pb.Logger.log("100% verbose", pb.LogLevel.VERBOSE)
    assert caplog.records[-1].getMessage() == "100% verbose"
    assert caplog.records[-1].levelno == logging.DEBUG
    assert pb.Logger.LogLevel.ERROR == pb.Logger.ERROR == 2


def test_custom_metrics_are_kept_locally():
    family = pb.MetricFamily("latency_ns", "time spent", pb.MetricFamily.COUNTER)
    metric = family.Metric(labels={"model": "m"})
    metric.increment(5)
    metric.increment(2)
    assert metric.value() == 7
    with pytest.raises(pb.TritonModelException):
        metric.set(1)
    with pytest.raises(pb.TritonModelException):
        metric.increment(-1)
    gauge = pb.MetricFamily("g", "d", pb.MetricFamily.GAUGE).Metric()
    gauge.set(3)
    gauge.increment(-1)
    assert gauge.value() == 2
    histogram = pb.MetricFamily("h", "d", pb.MetricFamily.HISTOGRAM).Metric(buckets=[1, 10])
    histogram.observe(5)
    with pytest.raises(pb.TritonModelException):
        pb.MetricFamily("h2", "d", pb.MetricFamily.HISTOGRAM).Metric()
    assert family in pb._metric_families


def test_model_control_and_model_dir_need_the_worker(monkeypatch):
    with pytest.raises(pb.TritonModelException, match="not supported yet"):
        pb.load_model("m")
    with pytest.raises(pb.TritonModelException, match="not supported yet"):
        pb.is_model_ready("m")
    with pytest.raises(pb.TritonModelException):
        pb.get_model_dir()
    monkeypatch.setattr(pb, "_model_dir", "/models/m/1")
    assert pb.get_model_dir() == "/models/m/1"


def test_constants():
    assert pb.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START == 1
    assert pb.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END == 2
    assert pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL == 1
    assert pb.TRITONSERVER_REQUEST_RELEASE_ALL == 1
    assert pb.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE == 2
    assert pb.TRITONSERVER_MEMORY_CPU != pb.TRITONSERVER_MEMORY_GPU


# -- the import name models use -------------------------------------------------

def test_shim_is_the_same_module():
    """The worker's runner makes `triton_python_backend_utils` this very module (no
    top-level file is installed: it would shadow the real Triton's stub)."""
    import workers.python_backend.runner  # noqa: F401  installs the alias
    import triton_python_backend_utils as shim

    assert shim is pb
    for name in pb.__all__:
        assert getattr(shim, name) is getattr(pb, name)
    namespace = {}
    exec("from triton_python_backend_utils import *", namespace)
    assert namespace["Tensor"] is pb.Tensor and namespace["TritonError"] is pb.TritonError
    assert set(pb.__all__) <= set(namespace)


def test_an_add_sub_model_runs_unchanged():
    # the shape of Triton's examples/add_sub/model.py
    import workers.python_backend.runner  # noqa: F401  installs the alias
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            config = json.loads(args["model_config"])
            out0 = pb_utils.get_output_config_by_name(config, "OUTPUT0")
            self.dtype = pb_utils.triton_string_to_numpy(out0["data_type"])

        def execute(self, requests):
            responses = []
            for req in requests:
                a = pb_utils.get_input_tensor_by_name(req, "INPUT0").as_numpy()
                b = pb_utils.get_input_tensor_by_name(req, "INPUT1").as_numpy()
                out0 = pb_utils.Tensor("OUTPUT0", (a + b).astype(self.dtype))
                out1 = pb_utils.Tensor("OUTPUT1", (a - b).astype(self.dtype))
                responses.append(pb_utils.InferenceResponse(output_tensors=[out0, out1]))
            return responses

    model = TritonPythonModel()
    model.initialize({"model_config": json.dumps(CONFIG)})
    x = np.arange(4, dtype=np.float32)
    req = request([pb.Tensor._from_server("INPUT0", "FP32", x),
                   pb.Tensor._from_server("INPUT1", "FP32", x * 2)])
    [resp] = model.execute([req])
    out = {t.name(): t for t in resp.output_tensors()}
    assert out["OUTPUT0"]._datatype == "FP32"
    assert out["OUTPUT0"]._host_array().tolist() == (x * 3).tolist()
    assert out["OUTPUT1"].as_numpy().tolist() == (-x).tolist()
