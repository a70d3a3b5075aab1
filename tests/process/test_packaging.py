"""Packaging that lives beside others (issue 11, part 9): no top-level
`triton_python_backend_utils` in the wheel (it would shadow the real Triton's stub in the
same environment), onnxruntime builds that never install together, the console
scripts, the license and the project metadata."""

import importlib
import importlib.metadata
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]


def requirement_names(reqs):
    return {re.match(r"[A-Za-z0-9_.-]+", r).group(0).lower().replace("_", "-")
            for r in reqs}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    # the build backend from this environment when it is recent enough (no network,
    # faster); else pip's isolated build fetches what build-system asks for
    try:
        major = int(importlib.metadata.version("setuptools").split(".")[0])
    except importlib.metadata.PackageNotFoundError:
        major = 0
    # from a copy of what the Dockerfile copies too: a build in the checkout would leave
    # build/ there, whose stale files setuptools puts into later wheels
    src = tmp_path_factory.mktemp("src")
    for path in [ROOT / "pyproject.toml", ROOT / "README.md", ROOT / "LICENSE",
                 *ROOT.glob("*.py")]:  # top-level modules too, were any declared
        shutil.copy(path, src / path.name)
    for pkg in ("frontend", "scheduler", "shm", "workers"):
        shutil.copytree(ROOT / pkg, src / pkg,
                        ignore=shutil.ignore_patterns("__pycache__"))
    if major >= 77:
        # the backend's PEP 517 hook, which is all pip's --no-build-isolation build
        # runs, without pip's start and its hook process (~1.5 s of CPU of the ~2)
        build = [sys.executable, "-c", "import sys; from setuptools import build_meta; "
                 "build_meta.build_wheel(sys.argv[1])", str(out)]
    else:
        build = [sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "-q",
                 "-w", str(out)]
    done = subprocess.run(build, capture_output=True, text=True, timeout=300, cwd=src)
    assert done.returncode == 0, done.stdout + done.stderr
    (path,) = out.glob("shmserve-*.whl")
    with zipfile.ZipFile(path) as zf:
        return {name: zf.read(name) for name in zf.namelist()}


def test_wheel_has_no_top_level_pb_utils(wheel):
    """The wheel installs no `triton_python_backend_utils` module or package at the
    top of site-packages; the API ships inside workers/python_backend."""
    top = {name.split("/")[0] for name in wheel}
    assert not any(t.startswith("triton_python_backend_utils") for t in top), top
    assert "workers/python_backend/pb_utils.py" in wheel
    assert top - {n for n in top if n.endswith(".dist-info")} == {
        "frontend", "scheduler", "shm", "workers"}


def test_wheel_carries_license_scripts_and_metadata(wheel):
    """The wheel's metadata has the license file, both console scripts and the
    project metadata."""
    dist = next(n.split("/")[0] for n in wheel if n.endswith(".dist-info/METADATA"))
    meta = wheel[f"{dist}/METADATA"].decode()
    assert any(n.startswith(dist) and n.endswith("LICENSE") for n in wheel)
    entry = wheel[f"{dist}/entry_points.txt"].decode()
    assert "shmserve = scheduler.main:main" in entry
    assert "shmserve-bench = scheduler.bench.main:main" in entry
    for field in ("License-Expression: Apache-2.0", "Requires-Python: >=3.10",
                  "Author: ", "Project-URL: ", "Classifier: ", "Summary: "):
        assert field in meta, field
    assert "Provides-Extra: cpu" in meta and "Provides-Extra: gpu" in meta


def test_cpu_and_gpu_extras_exclude_each_other():
    """onnxruntime and onnxruntime-gpu install the same module: the base requirements
    have neither, `cpu` brings one, `gpu` the other, and no extra brings both."""
    base = requirement_names(PROJECT["dependencies"])
    assert not base & {"onnxruntime", "onnxruntime-gpu"}
    extras = {k: requirement_names(v) for k, v in PROJECT["optional-dependencies"].items()}
    assert "onnxruntime" in extras["cpu"] and "onnxruntime-gpu" not in extras["cpu"]
    assert "onnxruntime-gpu" in extras["gpu"] and "onnxruntime" not in extras["gpu"]
    for name, reqs in extras.items():
        assert not {"onnxruntime", "onnxruntime-gpu"} <= reqs, name
    # the other extras (test, pytorch) are combined with either build
    for name in set(extras) - {"cpu", "gpu"}:
        assert not extras[name] & {"onnxruntime", "onnxruntime-gpu"}, name


def test_setup_script_adds_cpu_unless_gpu_is_named():
    """scripts/setup installs the `cpu` extra by default (so `scripts/setup test pytorch`
    keeps its onnxruntime) and never with `gpu`."""
    setup = (ROOT / "scripts" / "setup").read_text()
    line = next(ln for ln in setup.splitlines() if "set -- \"$@\" cpu" in ln)
    for args, want in ((["test", "pytorch"], "[test,pytorch,cpu]"),
                       (["test", "gpu"], "[test,gpu]"), (["cpu"], "[cpu]")):
        script = f'{line}\necho "[$(IFS=,; echo "$*")]"'
        done = subprocess.run(["bash", "-c", script, "setup", *args], capture_output=True,
                              text=True, timeout=30)
        assert done.stdout.strip() == want, (args, done.stdout, done.stderr)


def test_console_scripts_resolve():
    """Each console script names an importable callable."""
    for name, target in PROJECT["scripts"].items():
        module, func = target.split(":")
        assert callable(getattr(importlib.import_module(module), func)), name


def test_scripts_bench_still_runs():
    """`scripts/bench` (the checkout's launcher) runs the moved module's main."""
    done = subprocess.run([str(ROOT / "scripts" / "bench"), "--help"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "--concurrency" in done.stdout
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import bench
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    from scheduler.bench import main as moved
    assert bench is moved


def test_license_and_metadata():
    """Apache-2.0 (as Triton), with the text in LICENSE, and complete metadata."""
    assert PROJECT["license"] == "Apache-2.0"
    assert "Apache License" in (ROOT / "LICENSE").read_text()[:200]
    assert PROJECT["license-files"] == ["LICENSE"]
    for key in ("description", "readme", "authors", "urls", "classifiers",
                "requires-python", "keywords"):
        assert PROJECT.get(key), key
    assert "py-modules" not in PYPROJECT.get("tool", {}).get("setuptools", {})


def test_models_get_the_name_from_the_worker_only():
    """The checkout has no top-level triton_python_backend_utils (run from the checkout,
    it too would shadow the real Triton's stub); the python-backend runner installs the
    name, as the very pb_utils module, before it imports a model.py."""
    assert not list(ROOT.glob("triton_python_backend_utils*"))
    code = ("import sys; import workers.python_backend.runner; "
            "import triton_python_backend_utils as t; "
            "from workers.python_backend import pb_utils; assert t is pb_utils")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env={"PYTHONPATH": str(ROOT),
                                                      "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr


def test_a_missing_onnxruntime_names_the_extras(monkeypatch):
    """Installed without `cpu` or `gpu`, an onnxruntime model fails to load with a
    message that names the two extras."""
    import json

    from shm.messages.worker import LoadInstance
    from workers.backends import create_instance

    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import raises ImportError
    monkeypatch.delitem(sys.modules, "workers.onnx_backend", raising=False)
    config = json.dumps({"name": "m", "backend": "onnxruntime"}).encode()
    with pytest.raises(RuntimeError, match=r"shmserve\[cpu\]' or 'shmserve\[gpu\]"):
        create_instance(LoadInstance("m_0", "m_0", "m", 1, "/nowhere", config))
