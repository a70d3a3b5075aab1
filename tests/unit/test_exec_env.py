"""EXECUTION_ENV_PATH resolution (scheduler/processes/exec_env.py): the parameter's expansion,
directories and tarballs, the unpack cache, the errors a load reports, and the worker's
environment. No server; the end-to-end check is tests/e2e/test_execution_env.py."""

import json
import os
import stat
import tarfile

import pytest

from scheduler.processes import exec_env


def config(value=None):
    params = {} if value is None else {
        "EXECUTION_ENV_PATH": {"string_value": value}}
    return json.dumps({"name": "m", "backend": "python", "parameters": params}).encode()


def fake_env(root):
    (root / "bin").mkdir(parents=True)
    py = root / "bin" / "python"
    py.write_text("#!/bin/sh\n")
    py.chmod(py.stat().st_mode | stat.S_IXUSR)
    (root / "lib").mkdir()
    return root


def pack(src, tarball):
    with tarfile.open(tarball, "w:gz") as tar:
        tar.add(src, arcname=".")
    return tarball


def test_model_directory_variable_is_expanded():
    """$$TRITON_MODEL_DIRECTORY stands for the model's folder; no parameter means no
    environment."""
    assert exec_env.env_path_of(config("$$TRITON_MODEL_DIRECTORY/env.tar.gz"),
                                "/repo/m/") == "/repo/m/env.tar.gz"
    assert exec_env.env_path_of(config("/envs/py"), "/repo/m") == "/envs/py"
    assert exec_env.env_path_of(config(), "/repo/m") == ""
    assert exec_env.env_path_of(config(""), "/repo/m") == ""


def test_a_path_that_leaves_the_model_directory_is_refused():
    """With $$TRITON_MODEL_DIRECTORY the path must stay inside the model's folder
    (Triton leaves escaping undefined; here it is a load error)."""
    for value in ("$$TRITON_MODEL_DIRECTORY/../other/env.tar.gz",
                  "$$TRITON_MODEL_DIRECTORY/.."):
        with pytest.raises(exec_env.ExecEnvError, match="leaves the model directory"):
            exec_env.env_path_of(config(value), "/repo/m")
    assert exec_env.env_path_of(config("$$TRITON_MODEL_DIRECTORY/a/../env"),
                                "/repo/m") == "/repo/m/a/../env"


def test_a_directory_is_used_in_place(tmp_path):
    """A directory env is its own root; nothing is copied into the cache."""
    env = fake_env(tmp_path / "env")
    cache = tmp_path / "cache"
    assert exec_env.prepare(str(env), str(cache)) == str(env)
    assert exec_env.interpreter(str(env)) == str(env / "bin" / "python")
    assert not cache.exists()


def test_a_tarball_is_unpacked_once_and_again_when_it_changes(tmp_path):
    """The first load unpacks into the cache; later loads reuse that folder; a tarball
    rewritten since is unpacked afresh (the key holds its size and mtime)."""
    tarball = pack(fake_env(tmp_path / "src"), tmp_path / "env.tar.gz")
    cache = tmp_path / "cache"
    root = exec_env.prepare(str(tarball), str(cache))
    assert os.path.dirname(root) == str(cache)
    assert os.access(os.path.join(root, "bin", "python"), os.X_OK)
    marker = os.path.join(root, "seen")
    open(marker, "w").close()
    assert exec_env.prepare(str(tarball), str(cache)) == root and os.path.exists(marker)
    (tmp_path / "src" / "extra").write_text("changed")
    pack(tmp_path / "src", tarball)
    os.utime(tarball, ns=(1, 1))
    again = exec_env.prepare(str(tarball), str(cache))
    assert again != root and os.path.exists(os.path.join(again, "extra"))
    assert sorted(os.listdir(cache)) == sorted([os.path.basename(root),
                                               os.path.basename(again)])


def bad_path(tmp_path, kind):
    if kind == "zip":
        (tmp_path / "env.zip").write_text("x")
        return tmp_path / "env.zip"
    if kind == "corrupt":
        (tmp_path / "env.tar.gz").write_text("not gzip")
        return tmp_path / "env.tar.gz"
    if kind == "no-python":
        (tmp_path / "nopython").mkdir()
        return tmp_path / "nopython"
    return tmp_path / "missing"


@pytest.mark.parametrize("kind, error", [
    ("missing", "does not exist"), ("zip", "neither a directory"),
    ("corrupt", "cannot unpack"), ("no-python", "has no bin/python")])
def test_bad_paths_fail_the_load_with_a_reason(tmp_path, kind, error):
    """A path that is missing, not an env, corrupt or without an interpreter fails with
    a message naming the problem, and leaves no half-unpacked folder in the cache."""
    cache = tmp_path / "cache"
    with pytest.raises(exec_env.ExecEnvError, match=error):
        exec_env.prepare(str(bad_path(tmp_path, kind)), str(cache))
    assert not cache.exists() or os.listdir(cache) == []


def test_worker_environment_activates_the_env(tmp_path):
    """The worker sees the env's bin/ and lib/ first, shmserve's packages (and only
    them) on PYTHONPATH, and no PYTHONHOME of the server's."""
    env = fake_env(tmp_path / "env")
    pkgs = exec_env.package_links(str(tmp_path / "run"))
    assert sorted(os.listdir(pkgs)) == sorted(exec_env.PACKAGES)
    assert os.path.isfile(os.path.join(pkgs, "scheduler", "processes", "exec_env.py"))
    base = {"PATH": "/usr/bin", "PYTHONPATH": "/elsewhere", "PYTHONHOME": "/x"}
    out = exec_env.child_environ(str(env), pkgs, base)
    assert out["PATH"] == f"{env}/bin:/usr/bin"
    assert out["LD_LIBRARY_PATH"] == f"{env}/lib"
    assert out["PYTHONPATH"] == pkgs and "PYTHONHOME" not in out
    assert out["CONDA_PREFIX"] == str(env) and out["PYTHONNOUSERSITE"] == "1"
