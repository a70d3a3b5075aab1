"""Per-model Python environments: the python backend's `EXECUTION_ENV_PATH` parameter.

A python model's config may name an environment its worker runs in:

    parameters { key: "EXECUTION_ENV_PATH"
                 value: { string_value: "$$TRITON_MODEL_DIRECTORY/env.tar.gz" } }

As in Triton's python backend, `$$TRITON_MODEL_DIRECTORY` stands for the model's folder
in the repository, and the value is either a packed environment (a conda-pack style
tarball: .tar.gz, .tgz or .tar) or, since Triton 23.x, an environment directory used in
place. A tarball is unpacked once into a cache folder keyed by its path, size and mtime,
so restarts and further instances reuse it and a changed tarball is unpacked afresh.

The worker then runs under `<env>/bin/python`, with the env's bin/ and lib/ first on
PATH and LD_LIBRARY_PATH as its activation would set them. The environment provides
the third-party packages (numpy, msgspec, ... and whatever model.py imports); shmserve's
own packages come from the serving installation through PYTHONPATH (a folder of links
to just those packages, so the env's interpreter never sees the server's other
site-packages, which may be built for another Python).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tempfile

PARAMETER = "EXECUTION_ENV_PATH"
MODEL_DIR_VAR = "$$TRITON_MODEL_DIRECTORY"
TARBALL_SUFFIXES = (".tar.gz", ".tgz", ".tar")
# shmserve's own top-level packages: what a worker under another interpreter must import
PACKAGES = ("frontend", "scheduler", "shm", "workers")


class ExecEnvError(RuntimeError):
    pass


def env_path_of(config_json: bytes | str, model_dir: str) -> str:
    """The EXECUTION_ENV_PATH of a model config (Triton's JSON form), expanded; "" when
    the model names none. Raises ExecEnvError for a path that leaves the model folder."""
    params = json.loads(config_json).get("parameters") or {}
    value = (params.get(PARAMETER) or {}).get("string_value", "").strip()
    if MODEL_DIR_VAR not in value:
        return value
    model_dir = model_dir.rstrip("/")
    path = value.replace(MODEL_DIR_VAR, model_dir)
    # Triton leaves a path that climbs out of the model's folder undefined (its README,
    # note 4); here it is an error rather than a guess
    inside = os.path.realpath(model_dir) + os.sep
    if not (os.path.realpath(path) + os.sep).startswith(inside):
        raise ExecEnvError(f"{PARAMETER} '{value}' leaves the model directory")
    return path


def default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"),
                                                             ".cache")
    return os.path.join(base, "shmserve", "execution_envs")


def prepare(path: str, cache_dir: str) -> str:
    """The environment's root folder for `path` (a directory, or a tarball unpacked into
    `cache_dir` on first use). Raises ExecEnvError with a message for the model's load
    error. Blocking (unpacking takes seconds): call it off the event loop."""
    if os.path.isdir(path):
        root = os.path.abspath(path)
    elif os.path.isfile(path):
        if not path.endswith(TARBALL_SUFFIXES):
            raise ExecEnvError(f"{PARAMETER} '{path}' is neither a directory nor a "
                               f"packed environment ({', '.join(TARBALL_SUFFIXES)})")
        root = _unpacked(os.path.abspath(path), cache_dir)
    else:
        raise ExecEnvError(f"{PARAMETER} '{path}' does not exist")
    interpreter(root)  # fail the load now, not in a worker that cannot start
    return root


def interpreter(root: str) -> str:
    for name in ("python", "python3"):
        exe = os.path.join(root, "bin", name)
        if os.access(exe, os.X_OK):
            return exe
    raise ExecEnvError(f"execution environment '{root}' has no bin/python")


def _unpacked(tarball: str, cache_dir: str) -> str:
    st = os.stat(tarball)
    key = hashlib.sha256(f"{tarball}\0{st.st_size}\0{st.st_mtime_ns}".encode()).hexdigest()
    root = os.path.join(cache_dir, key[:24])
    if os.path.isdir(root):
        return root
    os.makedirs(cache_dir, exist_ok=True)
    # unpack beside the final name and rename: a server killed halfway, or two instances
    # unpacking at once, never leave a half-unpacked env under the final name
    tmp = tempfile.mkdtemp(prefix=".unpack-", dir=cache_dir)
    try:
        try:
            with tarfile.open(tarball) as tar:
                # conda-pack archives hold symlinks into the env; "tar" keeps them but
                # still refuses members that would land outside `tmp`
                if hasattr(tarfile, "tar_filter"):
                    tar.extractall(tmp, filter="tar")
                else:  # Python without extraction filters (< 3.10.12 / 3.11.4)
                    tar.extractall(tmp)
        except (tarfile.TarError, OSError) as e:
            raise ExecEnvError(f"cannot unpack {PARAMETER} '{tarball}': {e}") from e
        # conda-pack's fixer rewrites the build prefix baked into scripts and configs
        fixer = os.path.join(tmp, "bin", "conda-unpack")
        if os.path.isfile(fixer):
            done = subprocess.run([interpreter(tmp), fixer], capture_output=True, text=True,
                                  timeout=600)
            if done.returncode != 0:
                raise ExecEnvError(f"conda-unpack failed for '{tarball}': "
                                   f"{done.stderr.strip()[-500:]}")
        interpreter(tmp)  # an archive that is no environment is not cached
        try:
            os.rename(tmp, root)
        except OSError:
            if not os.path.isdir(root):  # not a lost race with another unpacker
                raise
        else:
            tmp = ""
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    return root


def package_links(run_dir: str) -> str:
    """A folder in `run_dir` with links to shmserve's own packages, for PYTHONPATH."""
    # the checkout (or site-packages) holding scheduler/: three levels above this file
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    folder = os.path.join(run_dir, "pkgs")
    os.makedirs(folder, exist_ok=True)
    for name in PACKAGES:
        link = os.path.join(folder, name)
        if not os.path.lexists(link):
            os.symlink(os.path.join(here, name), link)
    return folder


def child_environ(root: str, pkgs: str, base: dict[str, str] | None = None) -> dict:
    """The worker's environment: the env activated, shmserve's packages importable."""
    env = dict(os.environ if base is None else base)

    def prepend(var: str, value: str) -> None:
        env[var] = value + (os.pathsep + env[var] if env.get(var) else "")

    prepend("PATH", os.path.join(root, "bin"))
    prepend("LD_LIBRARY_PATH", os.path.join(root, "lib"))
    env["PYTHONPATH"] = pkgs  # the server's PYTHONPATH may point at another Python's
    marker = "VIRTUAL_ENV" if os.path.isfile(os.path.join(root, "pyvenv.cfg")) else \
        "CONDA_PREFIX"
    env[marker] = root
    env.pop("PYTHONHOME", None)
    env["PYTHONNOUSERSITE"] = "1"  # the env alone, not ~/.local, as Triton advises
    return env
