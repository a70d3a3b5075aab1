"""EXECUTION_ENV_PATH (Triton's python-backend parameter): a python model's worker runs
under the named environment's interpreter, a directory used in place or a packed
environment unpacked once into a cache, with $$TRITON_MODEL_DIRECTORY expanded.

The environments are venvs built here. The server's own dependencies (numpy, msgspec,
...) reach them through a .pth file naming this interpreter's site-packages (a
`--system-site-packages` venv would see the base Python's, not this venv's); shmserve's
own packages come from the server (scheduler/processes/exec_env.py), which the test checks by
importing `workers` from the model.
"""

import os
import subprocess
import sys
import sysconfig
import tarfile
import textwrap

import numpy as np
import pytest

from tests.e2e import clients
from tests.e2e.harness import ServerProcess, wait_until

pytestmark = pytest.mark.e2e

MODEL = textwrap.dedent('''
    import os
    import sys

    import numpy as np
    import triton_python_backend_utils as pb_utils
    import workers


    class TritonPythonModel:
        def execute(self, requests):
            info = [sys.executable, sys.prefix, os.path.dirname(workers.__file__)]
            out = np.array([s.encode() for s in info], dtype=np.object_)
            return [pb_utils.InferenceResponse([pb_utils.Tensor("INFO", out)])
                    for _ in requests]
''')

CONFIG = '''
backend: "python"
max_batch_size: 0
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "INFO" data_type: TYPE_STRING dims: [ 3 ] }} ]
{params}
'''


def make_venv(root):
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True,
                   timeout=120)
    site = next(root.glob("lib/python*/site-packages"))
    ours = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    (site / "server_deps.pth").write_text("\n".join(sorted(ours)) + "\n")


def add_model(repo, name, params=""):
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(MODEL)
    (repo / name / "config.pbtxt").write_text(CONFIG.format(params=params))


def env_param(value):
    return ('parameters { key: "EXECUTION_ENV_PATH" '
            f'value: {{ string_value: "{value}" }} }}')


@pytest.fixture(scope="module")
def env_server(tmp_path_factory):
    base = tmp_path_factory.mktemp("exec-env")
    env_dir = base / "env_dir"
    make_venv(env_dir)
    repo = base / "models"
    add_model(repo, "in_dir_env", env_param(env_dir))
    add_model(repo, "in_packed_env", env_param("$$TRITON_MODEL_DIRECTORY/env.tar.gz"))
    add_model(repo, "in_server_env")
    add_model(repo, "in_missing_env", env_param("$$TRITON_MODEL_DIRECTORY/gone.tar.gz"))
    with tarfile.open(repo / "in_packed_env" / "env.tar.gz", "w:gz") as tar:
        tar.add(env_dir, arcname=".")
    cache = base / "cache"
    # --exit-on-error=false: the server starts with in_missing_env failed (so never
    # "ready" as a whole); wait for its live models instead
    srv = ServerProcess(repo, "--exit-on-error=false", log_dir=base,
                        env={"XDG_CACHE_HOME": str(cache)})
    srv.env_dir, srv.cache = env_dir, cache / "shmserve" / "execution_envs"
    srv.start(wait_ready=False)
    try:
        c = clients.client(srv, "http")
        wait_until(lambda: srv.proc.poll() is not None or all(
            _ready(c, m) for m in ("in_dir_env", "in_packed_env", "in_server_env")),
            120, 0.1, "the models with an environment")
        assert srv.proc.poll() is None, srv.log()
        yield srv
    finally:
        srv.stop_checked()


def _ready(c, model):
    try:
        return c.is_model_ready(model)
    except Exception:  # not listening yet
        return False


def info(server, protocol, model):
    c = clients.client(server, protocol)
    inp = clients.infer_input(protocol, "IN", np.array([1], dtype=np.int32), "INT32")
    out = c.infer(model, [inp]).as_numpy("INFO")
    return [v.decode() if isinstance(v, bytes) else v for v in out]


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("protocol", clients.PROTOCOLS)
def test_directory_env_runs_the_worker(env_server, protocol):
    """A directory EXECUTION_ENV_PATH: the worker's interpreter is <env>/bin/python and
    shmserve's packages are the serving checkout's."""
    exe, prefix, pkg = info(env_server, protocol, "in_dir_env")
    assert exe == str(env_server.env_dir / "bin" / "python")
    assert os.path.realpath(prefix) == os.path.realpath(env_server.env_dir)
    assert os.path.realpath(pkg) == os.path.join(ROOT, "workers")


@pytest.mark.parametrize("protocol", clients.PROTOCOLS)
def test_packed_env_is_unpacked_once_into_the_cache(env_server, protocol):
    """A tarball under $$TRITON_MODEL_DIRECTORY: unpacked into the cache folder, and the
    worker runs under the unpacked env's interpreter."""
    exe, prefix, _ = info(env_server, protocol, "in_packed_env")
    unpacked = [p for p in env_server.cache.iterdir() if not p.name.startswith(".")]
    assert len(unpacked) == 1  # one tarball, unpacked once, no half-unpacked leftovers
    assert [p.name for p in env_server.cache.iterdir()] == [unpacked[0].name]
    assert exe == str(unpacked[0] / "bin" / "python")
    assert os.path.realpath(prefix) == os.path.realpath(unpacked[0])


@pytest.mark.parametrize("protocol", clients.PROTOCOLS)
def test_without_the_parameter_the_server_interpreter_runs(env_server, protocol):
    """No EXECUTION_ENV_PATH: the worker runs under the server's own interpreter."""
    exe, prefix, _ = info(env_server, protocol, "in_server_env")
    assert exe == sys.executable and prefix == sys.prefix


@pytest.mark.parametrize("protocol", clients.PROTOCOLS)
def test_a_missing_env_fails_the_load_with_its_path(env_server, protocol):
    """An EXECUTION_ENV_PATH that does not exist fails that model's load with an error
    naming the expanded path; the server and its other models stay up."""
    c = clients.client(env_server, protocol)
    assert not c.is_model_ready("in_missing_env")
    assert c.is_server_live() and c.is_model_ready("in_dir_env")
    assert "in_missing_env/gone.tar.gz' does not exist" in env_server.log()
