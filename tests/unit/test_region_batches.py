"""Batches with inputs in clients' system regions, in one process (workers/framework.py,
workers/python_backend/runner.py, workers/tensors.py over real POSIX shm objects): an
input is read once, straight into its rows of the batch tensor (into memory of the
worker's own for a batch of one), and never through a mapping of the client's
object; a request whose client shrank its object under it fails alone, with an error
naming its region, and the batch runs without it."""

import json
import os
import textwrap
import uuid

import numpy as np
import pytest

pytest.importorskip("onnx")

from scheduler.repository.config import config_to_json, load_config, normalize, validate  # noqa: E402
from shm.errors import ErrorCode, InferError  # noqa: E402
from shm.messages.frontend import InferRequest  # noqa: E402
from shm.messages.worker import LoadInstance  # noqa: E402
from shm.tensor import TensorRef  # noqa: E402
from tests import onnx_models  # noqa: E402
from workers.backends import create_instance  # noqa: E402
from workers.python_backend.runner import PythonInstance  # noqa: E402
from workers.tensors import TensorIO  # noqa: E402

ROW = 16  # floats per request


@pytest.fixture
def objects():
    """Clients' objects: make(tag, values) -> a region ref of [1, ROW] FP32 over one."""
    made = []

    def make(tag, values, uid):
        key = f"/sstest-batch-{uuid.uuid4().hex[:10]}"
        with open(f"/dev/shm{key}", "xb") as f:
            f.write(np.asarray(values, np.float32).tobytes())
        made.append(key)
        return TensorRef("INPUT0", "FP32", [1, ROW], segment=key, offset=0,
                         nbytes=ROW * 4, region=uid, region_name=tag)

    yield make
    for key in made:
        os.unlink(f"/dev/shm{key}")


def _shrink(ref):
    os.truncate(f"/dev/shm{ref.segment}", 0)


def _request(i, ref):
    return InferRequest(i, "test", "m", 1, [ref], batch_size=1)


def _inline(values):
    x = np.asarray(values, np.float32).reshape(1, ROW)
    return TensorRef("INPUT0", "FP32", [1, ROW], data=x.tobytes())


def _mapped(key: str) -> bool:
    with open("/proc/self/maps") as f:
        return any(key in line for line in f)


IDENTITY = f"""name: "ident"
backend: "onnxruntime"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {ROW} ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {ROW} ] }} ]
"""


@pytest.fixture(scope="module")
def identity(tmp_path_factory):
    model_dir = onnx_models.identity(tmp_path_factory.mktemp("m") / "ident", dims=(ROW,),
                                     config=IDENTITY)
    config = normalize(load_config(model_dir), model_files=["model.onnx"])
    validate(config)
    msg = LoadInstance("i0", "ident_0", "ident", 1, str(model_dir),
                       json.dumps(config_to_json(config)).encode())
    inst, _ = create_instance(msg)
    yield inst
    inst.finalize()


def _outputs(result):
    assert not isinstance(result, Exception), result
    (name, _, array), = result
    return np.asarray(array)


def test_a_batch_reads_each_region_input_once_into_its_rows(identity, objects):
    a = objects("a", np.arange(ROW), 1)
    b = objects("b", np.arange(ROW) * 2, 2)
    io = TensorIO(None, "test")
    identity.copies = type(identity.copies)()
    results = identity.execute([_request(0, a), _request(1, _inline(np.ones(ROW))),
                                _request(2, b)], io)
    np.testing.assert_array_equal(_outputs(results[0]), [np.arange(ROW)])
    np.testing.assert_array_equal(_outputs(results[1]), [np.ones(ROW)])
    np.testing.assert_array_equal(_outputs(results[2]), [np.arange(ROW) * 2])
    # one copy per input: the regions' read into the batch tensor, the inline one's
    # copied there; none of them through a mapping of the client's object
    assert identity.copies.host == 3 * ROW * 4
    assert not _mapped(a.segment) and not _mapped(b.segment)
    # a batch of one: read into memory of the worker's own, once
    identity.copies = type(identity.copies)()
    (one,) = identity.execute([_request(3, a)], io)
    np.testing.assert_array_equal(_outputs(one), [np.arange(ROW)])
    assert identity.copies.host == ROW * 4 and not _mapped(a.segment)
    io.close()


@pytest.mark.parametrize("shrunk", [0, 1, 2])
def test_a_request_whose_region_shrank_fails_alone(identity, objects, shrunk):
    refs = [objects(tag, np.arange(ROW) + k, k + 1) for k, tag in enumerate("abc")]
    _shrink(refs[shrunk])
    io = TensorIO(None, "test")
    results = identity.execute([_request(k, r) for k, r in enumerate(refs)], io)
    for k, result in enumerate(results):
        if k == shrunk:
            assert isinstance(result, InferError) and result.code == ErrorCode.INVALID_ARG
            assert result.message.startswith(
                f"shared memory region '{'abc'[k]}' was truncated after it was "
                f"registered: input 'INPUT0' needs bytes [0, {ROW * 4})"), result.message
        else:
            np.testing.assert_array_equal(_outputs(result), [np.arange(ROW) + k])
    for r in refs:
        _shrink(r)
    assert all(isinstance(x, InferError) for x in identity.execute(
        [_request(k, r) for k, r in enumerate(refs)], io))
    io.close()


MODEL = textwrap.dedent('''
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for r in requests:
                x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
                out.append(pb_utils.InferenceResponse([
                    pb_utils.Tensor("OUTPUT0", x),
                    pb_utils.Tensor("N", np.array([[len(requests)]], np.int32))]))
            return out
''')


def test_a_python_batch_runs_without_the_request_whose_region_shrank(tmp_path, objects):
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "model.py").write_text(MODEL)
    config = {"name": "m", "max_batch_size": 8,
              "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32"},
                         {"name": "N", "data_type": "TYPE_INT32"}]}
    inst = PythonInstance(LoadInstance("m", "m_0", "m", 1, str(tmp_path),
                                       json.dumps(config).encode()), config)
    refs = [objects(tag, np.arange(ROW) + k, k + 1) for k, tag in enumerate("abc")]
    _shrink(refs[1])
    io = TensorIO(None, "test")
    results = inst.execute([_request(k, r) for k, r in enumerate(refs)], io)
    assert isinstance(results[1], InferError) and "region 'b' was truncated" in \
        results[1].message
    for k in (0, 2):
        got = {name: np.asarray(array) for name, _, array in results[k]}
        np.testing.assert_array_equal(got["OUTPUT0"], [np.arange(ROW) + k])
        assert got["N"][0, 0] == 2  # the model ran the two others, together
    assert inst.copies.host == 2 * ROW * 4 and not _mapped(refs[0].segment)
    _shrink(refs[0])
    _shrink(refs[2])
    assert all(isinstance(x, InferError)
               for x in inst.execute([_request(k, r) for k, r in enumerate(refs)], io))
    io.close()


def test_ragged_region_inputs_are_read_flat_into_the_batch(tmp_path, objects):
    """A ragged input in clients' regions (requests of different lengths) is read
    straight into its place in the one concatenated 1-D tensor; the request whose
    object shrank fails alone, the batch inputs count only the others."""
    config = normalize(load_config(onnx_models.ragged_sums(tmp_path / "rag")),
                       model_files=["model.onnx"])
    validate(config)
    inst, _ = create_instance(LoadInstance("i1", "rag_0", "rag", 1, str(tmp_path / "rag"),
                                           json.dumps(config_to_json(config)).encode()))
    lengths = (3, 5, 2)
    xs = [np.arange(1, n + 1, dtype=np.float32) * (k + 1) for k, n in enumerate(lengths)]
    refs = []
    for k, x in enumerate(xs):
        ref = objects("abc"[k], x, k + 1)
        ref.name, ref.shape, ref.nbytes = "INPUT", [1, x.size], x.nbytes
        refs.append(ref)
    _shrink(refs[1])
    io = TensorIO(None, "test")
    try:
        results = inst.execute([_request(k, r) for k, r in enumerate(refs)], io)
        assert isinstance(results[1], InferError) and "'b' was truncated" in \
            results[1].message
        for k in (0, 2):
            got = {name: np.asarray(array) for name, _, array in results[k]}
            np.testing.assert_array_equal(got["SUM"], [[xs[k].sum()]])
            np.testing.assert_array_equal(got["DOUBLED"], [2 * xs[k]])
        # the first gather stopped at b, a read; the second read a and c, once each
        assert inst.copies.host == 2 * xs[0].nbytes + xs[2].nbytes
    finally:
        io.close()
        inst.finalize()
