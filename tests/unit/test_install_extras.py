"""What the README's install lines promise (issue 26), held against pyproject.toml: each
extra it names exists and brings what it says."""

import re
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[2]


def extras() -> dict[str, list[str]]:
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return doc["project"]["optional-dependencies"]


def test_every_extra_the_readme_installs_exists():
    readme = (ROOT / "README.md").read_text()
    named = {e.strip() for group in re.findall(r"pip install '\.\[([^\]]+)\]'", readme)
             for e in group.split(",")}
    assert {"cpu", "gpu", "pytorch", "bench"} <= named, named
    assert named <= set(extras()), named - set(extras())


def test_the_bench_extra_benches_over_http():
    """shmserve-bench drives HTTP by tritonclient.http; the base install brings only
    tritonclient[grpc] (for the generated protocol modules)."""
    assert any(re.match(r"tritonclient\[[^\]]*\bhttp\b", d) for d in extras()["bench"])


def test_onnx_needs_an_extra_and_the_readme_says_so():
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert not any(d.startswith("onnxruntime") for d in doc["project"]["dependencies"])
    assert any(d.startswith("onnxruntime") for d in extras()["cpu"])
    assert "`pip install .` alone cannot serve ONNX models" in \
        (ROOT / "README.md").read_text()
