"""Warmup sample synthesis (workers/warmup.py) and running samples on a real python
instance in-process, against Triton's rules for model_warmup."""

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from shm import datatypes
from shm.messages.worker import LoadInstance
from shm.tensor import TensorRef
from workers import warmup
from workers.python_backend.runner import PythonInstance
from workers.tensors import TensorIO

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "tests" / "models_warmup"


def config(max_batch_size=4, *settings, inputs=(("INPUT0", "TYPE_FP32", [4]),)):
    return {
        "name": "m", "backend": "python", "max_batch_size": max_batch_size,
        "input": [{"name": n, "data_type": t, "dims": d} for n, t, d in inputs],
        "model_warmup": list(settings),
    }


def sample(name="s", batch_size=1, count=0, **inputs):
    return {"name": name, "batch_size": batch_size, "count": count, "inputs": inputs}


def fp32(dims=(4,), **kind):
    return {"data_type": "TYPE_FP32", "dims": list(dims), **(kind or {"zero_data": True})}


def build(cfg, model_dir="/nonexistent", seed=0):
    return warmup.samples(cfg, "m", 1, str(model_dir), rng=np.random.default_rng(seed))


def array(ref: TensorRef):
    return datatypes.tensor_from_buffer(ref.datatype, ref.shape, ref.data)


def test_zero_data_makes_batch_size_requests_of_one_row_each():
    """Rule: a sample of batch_size N is N requests of shape [1, *dims] on a batching
    model, all zeros with zero_data; count 0 still runs once."""
    (s,) = build(config(4, sample("z", batch_size=3, INPUT0=fp32())))
    assert (s.name, s.count, len(s.requests)) == ("z", 1, 3)
    for req in s.requests:
        (ref,) = req.inputs
        assert (ref.name, ref.datatype, ref.shape) == ("INPUT0", "FP32", [1, 4])
        np.testing.assert_array_equal(array(ref), np.zeros((1, 4), np.float32))
        assert (req.model, req.version, req.batch_size) == ("m", 1, 1)


def test_zero_data_false_is_still_zero_data():
    """Rule: the data kind is a protobuf oneof, set by naming it: `zero_data: false` (as
    Triton's own L0_warmup writes) still selects zero data."""
    (s,) = build(config(4, sample(INPUT0=fp32(zero_data=False))))
    assert not np.any(array(s.requests[0].inputs[0]))


def test_count_and_sample_order_are_kept_and_batch_0_is_skipped():
    """Rule: samples run in config order, `count` times each; Triton skips batch_size 0
    samples."""
    got = build(config(4, sample("a", 1, count=3, INPUT0=fp32()),
                       sample("skipped", 0, INPUT0=fp32()),
                       sample("b", 2, INPUT0=fp32())))
    assert [(s.name, s.count, len(s.requests)) for s in got] == [("a", 3, 1), ("b", 1, 2)]


def test_non_batching_model_gets_dims_as_they_are():
    """Rule: with max_batch_size 0 no batch dimension is added; batch_size must be 1
    there (model_config.proto), and batch_size 0 is skipped."""
    (s,) = build(config(0, sample(batch_size=1, INPUT0=fp32((2, 3)))))
    assert s.requests[0].inputs[0].shape == [2, 3]
    assert build(config(0, sample(batch_size=0, INPUT0=fp32()))) == []
    with pytest.raises(warmup.WarmupError, match=r"warmup sample 's': batch_size 2 exceeds "
                                                 r"the model's max_batch_size 0"):
        build(config(0, sample(batch_size=2, INPUT0=fp32())))


def test_batch_size_above_max_batch_size_is_refused():
    """Rule: a warmup batch larger than the model takes fails the load, naming it."""
    with pytest.raises(warmup.WarmupError, match="batch_size 5 exceeds the model's "
                                                 "max_batch_size 4"):
        build(config(4, sample(batch_size=5, INPUT0=fp32())))


def test_inputs_the_config_does_not_declare_get_no_batch_dimension():
    """Rule: as Triton's override (control) inputs, undeclared names keep their dims."""
    (s,) = build(config(4, sample(INPUT0=fp32(), START={"data_type": "TYPE_INT32",
                                                        "dims": [1], "zero_data": True})))
    shapes = {ref.name: ref.shape for ref in s.requests[0].inputs}
    assert shapes == {"INPUT0": [1, 4], "START": [1]}


def test_random_data_has_the_right_size_and_type_and_is_shared_by_the_batch():
    """Rule: random_data fills the tensor with random bytes; every request of the sample
    carries the same data; BOOL stays 0/1."""
    cfg = config(4, sample(batch_size=2, INPUT0=fp32(random_data=True),
                           FLAGS={"data_type": "TYPE_BOOL", "dims": [64],
                                  "random_data": True}),
                 inputs=(("INPUT0", "TYPE_FP32", [4]), ("FLAGS", "TYPE_BOOL", [64])))
    (s,) = build(cfg, seed=1)
    first, second = s.requests
    assert len(first.inputs[0].data) == 16 and first.inputs[0].data == second.inputs[0].data
    flags = array(first.inputs[1])
    assert flags.shape == (1, 64) and set(np.unique(flags.view(np.uint8))) <= {0, 1}
    (other,) = build(cfg, seed=2)
    assert other.requests[0].inputs[0].data != first.inputs[0].data


@pytest.mark.parametrize("kind", ["zero_data", "random_data"])
def test_bytes_inputs_get_empty_strings_for_zero_and_random_data(kind):
    """Rule: Triton fills a STRING input's zero and random data with 4 zero bytes per
    element: every element is an empty string."""
    (s,) = build(config(4, sample(TEXT={"data_type": "TYPE_STRING", "dims": [3],
                                        kind: True}),
                        inputs=(("TEXT", "TYPE_STRING", [3]),)))
    ref = s.requests[0].inputs[0]
    assert (ref.datatype, ref.shape, ref.data) == ("BYTES", [1, 3], bytes(12))
    assert array(ref).tolist() == [[b"", b"", b""]]


def test_file_data_is_read_from_the_warmup_folder_exactly(tmp_path):
    """Rule: input_data_file names a file in <model dir>/warmup/ whose raw bytes are the
    tensor; a longer file is cut to the tensor's size."""
    (tmp_path / "warmup").mkdir()
    (tmp_path / "warmup" / "a.bin").write_bytes(struct.pack("<5f", 1.5, -2, 3, 4, 99))
    (s,) = build(config(4, sample(INPUT0=fp32(input_data_file="a.bin"))), tmp_path)
    np.testing.assert_array_equal(array(s.requests[0].inputs[0]),
                                  [[1.5, -2, 3, 4]])


def test_file_too_small_fails_with_triton_reason(tmp_path):
    """Rule: a file holding fewer bytes than the tensor needs fails the load."""
    (tmp_path / "warmup").mkdir()
    (tmp_path / "warmup" / "a.bin").write_bytes(bytes(8))
    with pytest.raises(warmup.WarmupError,
                       match=r"warmup sample 'short': warmup setting expects 16 bytes, but "
                             r"the data provided from a.bin only has 8 bytes"):
        build(config(4, sample("short", INPUT0=fp32(input_data_file="a.bin"))), tmp_path)


def test_missing_file_fails_naming_the_path(tmp_path):
    """Rule: an unreadable warmup file fails the load with its path."""
    with pytest.raises(warmup.WarmupError, match=r"warmup sample 's': failed to read data "
                                                 r"file for input 'INPUT0'.*nope.bin"):
        build(config(4, sample(INPUT0=fp32(input_data_file="nope.bin"))), tmp_path)


def test_bytes_file_is_serialized_elements_and_must_hold_the_element_count(tmp_path):
    """Rule: a STRING input from a file takes the whole file as length-prefixed elements;
    one that does not hold the sample's element count fails the load."""
    (tmp_path / "warmup").mkdir()
    (tmp_path / "warmup" / "two.bin").write_bytes(
        datatypes.serialize_bytes(np.array([b"ab", b"xyz"], dtype=object)))
    text = {"data_type": "TYPE_STRING", "dims": [2], "input_data_file": "two.bin"}
    cfg = config(4, sample(TEXT=text), inputs=(("TEXT", "TYPE_STRING", [2]),))
    (s,) = build(cfg, tmp_path)
    assert array(s.requests[0].inputs[0]).tolist() == [[b"ab", b"xyz"]]
    text["dims"] = [3]
    with pytest.raises(warmup.WarmupError, match="does not hold 3 serialized BYTES"):
        build(cfg, tmp_path)


def test_variable_dims_and_missing_data_kind_are_refused():
    """Rule: Triton needs every warmup dim fixed and one data kind per input."""
    with pytest.raises(warmup.WarmupError, match="expects all variable-size dimensions "
                                                 "are specified for input 'INPUT0'"):
        build(config(4, sample(INPUT0=fp32((-1,)))))
    with pytest.raises(warmup.WarmupError, match="expects input 'INPUT0' to have "
                                                 "input_data_type set"):
        build(config(4, sample(INPUT0={"data_type": "TYPE_FP32", "dims": [4]})))


def _python_instance(name: str) -> PythonInstance:
    model_dir = MODELS / name
    from scheduler.repository.config import config_to_json, load_config
    cfg = config_to_json(load_config(model_dir))
    msg = LoadInstance(f"{name}/1/x", f"{name}_0", name, 1, str(model_dir),
                       json.dumps(cfg).encode())
    return PythonInstance(msg, cfg)


def test_run_fails_with_the_sample_name_and_each_response_error():
    """Rule: a sample whose responses carry errors fails the warmup with Triton's text,
    "failed to run warmup sample '<name>': <error>; " (one error per request)."""
    inst = _python_instance("warmup_fails")
    samples = warmup.samples(inst.config, "warmup_fails", 1, str(MODELS / "warmup_fails"))
    with pytest.raises(warmup.WarmupError) as info:
        warmup.run(inst, samples, TensorIO(None, "test"))
    # the error is the python backend's, with the model.py line that raised
    model_py = MODELS / "warmup_fails" / "1" / "model.py"
    assert str(info.value) == ("failed to run warmup sample 'zero sample': "
                               "Failed to process the request(s) for model "
                               "'warmup_fails_0', message: "
                               "ValueError: all-zero input rejected\n\nAt:\n"
                               f"  {model_py}(12): execute\n; ")


def test_run_executes_each_sample_count_times_in_order(tmp_path, monkeypatch):
    """Rule: each sample runs `count` times as one batch of batch_size requests, in
    config order, with the data the sample names."""
    monkeypatch.setenv("WARMUP_PROBE_DIR", str(tmp_path))
    inst = _python_instance("warmup_probe")
    samples = warmup.samples(inst.config, "warmup_probe", 1, str(MODELS / "warmup_probe"))
    warmup.run(inst, samples, TensorIO(None, "test"))
    text = (tmp_path / "warmup_probe_0.jsonl").read_text()
    lines = [json.loads(x) for x in text.splitlines() if x]
    calls = [line["requests"] for line in lines if line["event"] == "execute"]
    assert [len(c) for c in calls] == [2, 2, 2, 1]
    for req in calls[0]:
        assert req["INPUT1"] == {"shape": [1, 3], "values": [[7, -8, 9]]}
        assert req["INPUT0"]["values"] == [[0, 0, 0, 0]]
        assert req["TEXT"]["values"] == ["", ""]
