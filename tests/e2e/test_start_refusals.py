"""A server that cannot serve what it was asked to says why at once and exits 1,
before it starts a process or takes a port."""

import subprocess
import sys

import pytest

from tests.e2e.harness import EXAMPLES, ROOT, free_ports

pytestmark = pytest.mark.e2e


def start(*repos: str) -> subprocess.CompletedProcess:
    http, grpc, metrics = free_ports(3)
    argv = [sys.executable, "-m", "scheduler.main",
            *(a for r in repos for a in ("--model-repository", r)),
            "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1",
            "--metrics-address", "127.0.0.1", "--http-port", str(http),
            "--grpc-port", str(grpc), "--metrics-port", str(metrics)]
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_a_repository_path_that_does_not_exist(tmp_path):
    """Rule: Triton 2.51's "failed to stat file <path>", here with the flag and the
    reason; not "some models failed to load" after serving nothing. One missing path
    among good ones is enough, as in Triton."""
    missing = str(tmp_path / "no_such_repository")
    out = start(str(EXAMPLES), missing)
    assert out.returncode == 1, out.stderr
    assert (f"failed to stat file {missing} (--model-repository: No such file or "
            "directory)") in out.stderr, out.stderr
    assert "models failed to load" not in out.stderr


def test_a_repository_path_that_is_a_file(tmp_path):
    """Rule: Triton's "repository path is not a valid directory", naming the path."""
    path = tmp_path / "config.pbtxt"
    path.write_text("")
    out = start(str(path))
    assert out.returncode == 1, out.stderr
    assert f"repository path is not a valid directory: {path}" in out.stderr, out.stderr
