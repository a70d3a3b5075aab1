"""scripts/serve's command line: a first try on localhost with client shared memory,
and neither once the user puts the server on an address of their own."""

import os
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def fake_python(tmp_path):
    """Stands in for the interpreter (SHMSERVE_PYTHON): prints the argv it was given."""
    exe = tmp_path / "python"
    exe.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return exe


def serve_argv(fake_python, *args: str) -> list[str]:
    out = subprocess.run(["bash", str(ROOT / "scripts" / "serve"), *args],
                         env={**os.environ, "SHMSERVE_PYTHON": str(fake_python)},
                         capture_output=True, text=True, timeout=30, check=True)
    return out.stdout.splitlines()


def flag(argv: list[str], name: str) -> str | None:
    """The value the server's argparse ends with for `name` (the last one wins)."""
    value = None
    for i, arg in enumerate(argv):
        if arg == name:
            value = argv[i + 1]
        elif arg.startswith(name + "="):
            value = arg.split("=", 1)[1]
    return value


def test_first_try_is_local_and_accepts_client_shm(fake_python):
    argv = serve_argv(fake_python, "--id=triton")
    assert argv[:2] == ["-m", "scheduler.main"]
    assert flag(argv, "--model-repository") == "examples/model_repository"
    for name in ("--http-address", "--grpc-address", "--metrics-address"):
        assert flag(argv, name) == "127.0.0.1", name
    assert flag(argv, "--allow-client-shm") == "true"
    assert flag(argv, "--id") == "triton"


@pytest.mark.parametrize("address", ["--http-address=0.0.0.0", "--grpc-address"])
def test_an_address_of_the_users_own_turns_the_first_try_off(fake_python, address):
    args = [address] if "=" in address else [address, "0.0.0.0"]
    argv = serve_argv(fake_python, *args)
    assert flag(argv, "--allow-client-shm") is None  # shmserve's default: off
    assert "127.0.0.1" not in argv


def test_client_shm_can_be_turned_off_on_localhost(fake_python):
    argv = serve_argv(fake_python, "--allow-client-shm=false")
    assert flag(argv, "--allow-client-shm") == "false"
