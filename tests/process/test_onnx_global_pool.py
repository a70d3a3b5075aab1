"""workers.onnx_backend's `enable-global-threadpool`: onnxruntime's global thread pool
is state of the whole process (set once, shared by every later session), so it is
checked in a child interpreter of its own."""

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("onnx")

from tests import onnx_models as om  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def add_sub(tmp_path_factory):
    return om.add_sub(tmp_path_factory.mktemp("onnx_repo") / "add_sub")


def path_of(model_dir) -> str:
    return str(model_dir / "1" / "model.onnx")


_GLOBAL_POOL_SCRIPT = """
import sys, numpy as np
from workers.onnx_backend import OnnxModel, auto_complete
path, backend_config = sys.argv[1], {"enable-global-threadpool": "1",
                                     "intra_op_thread_count": "1"}
config = auto_complete({"name": "add_sub"}, path, backend_config)
models = [OnnxModel(config, path, "cpu", backend_config) for _ in range(2)]
models.append(OnnxModel(config, path, "cpu", {}))  # later sessions must share the pool too
x = np.ones((1, 16), np.float32)
for m in models:
    assert m.session_options.use_per_session_threads is False
    assert (m.run({"INPUT0": x, "INPUT1": x}, ["OUTPUT0"])["OUTPUT0"] == 2).all()
print("ok")
"""


def test_global_thread_pool_from_backend_config(add_sub):
    # process-wide ORT state: checked in a process of its own
    done = subprocess.run([sys.executable, "-c", _GLOBAL_POOL_SCRIPT, path_of(add_sub)],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
