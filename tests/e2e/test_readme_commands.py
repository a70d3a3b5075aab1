"""The README's first commands, run as written: `./scripts/serve --id=triton`, the
curl lines and python snippets of "Talking to it" and "Client shared memory", and
Triton's own client examples that the README names, unchanged.

Triton's examples are not copied into this repository (they are the tritonclient
repository's code, and its pip package does not ship them): the test runs them from
the folder TRITON_CLIENT_EXAMPLES names (a copy of tritonclient's src/python/examples)
and is skipped, saying so, without it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.e2e.harness import ROOT, ServerProcess

pytestmark = pytest.mark.e2e

README = ROOT / "README.md"
# the ones the README names; each exits non-zero when a check of its own fails
TRITON_EXAMPLES = ["simple_http_infer_client", "simple_grpc_infer_client",
                   "simple_http_shm_client", "simple_grpc_shm_client",
                   "simple_http_health_metadata", "simple_grpc_health_metadata"]


def section(title: str) -> str:
    """The README's text under the heading `title`, up to the next heading."""
    text = README.read_text()
    match = re.search(rf"^#+ {re.escape(title)}\n(.*?)(?=^#+ )", text, re.M | re.S)
    assert match, f"README has no section '{title}'"
    return match.group(1)


def blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, re.M | re.S)


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    """`./scripts/serve --id=triton` on free ports: the README's command, with the
    interpreter running the tests in place of the .venv it would set up."""
    srv = ServerProcess(log_dir=tmp_path_factory.mktemp("serve-logs"),
                        env={"SHMSERVE_PYTHON": sys.executable})
    srv.argv = ["bash", str(ROOT / "scripts" / "serve"), "--id=triton",
                "--frontend-processes", "1", "--http-port", str(srv.http_port),
                "--grpc-port", str(srv.grpc_port), "--metrics-port", str(srv.metrics_port)]
    yield from srv.serve()


def on_ports(text: str, srv) -> str:
    """The README's text, talking to the test's server instead of the default ports."""
    return (text.replace("localhost:8000", f"localhost:{srv.http_port}")
                .replace("localhost:8001", f"localhost:{srv.grpc_port}")
                .replace('"localhost", 8000', f'"localhost", {srv.http_port}'))


def run_python(code: str, *args: str, cwd=ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args] if not code else
                          [sys.executable, "-c", code], cwd=cwd, capture_output=True,
                          text=True, timeout=90)


def test_talking_to_it_curl_lines(serve):
    (commands,) = [b for b in blocks(section("Talking to it"), "") if "curl" in b]
    out = subprocess.run(["bash", "-euc", on_ports(commands, serve).replace("curl -s", "curl -sS")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("200\n"), out.stdout
    assert '"name":"add_sub"' in out.stdout.replace(" ", "")
    # the infer answer: OUTPUT0 = INPUT0 + INPUT1
    assert '"data":[1.0,2.0,3.0' in out.stdout.replace(" ", ""), out.stdout


@pytest.mark.parametrize("title", ["Talking to it", "Client shared memory"])
def test_python_snippets(serve, title):
    snippets = blocks(section(title), "python")
    assert snippets, title
    for snippet in snippets:
        # a region name of this run's own: several test runs may share a machine
        code = on_ports(snippet, serve).replace("/my_input", f"/readme_{uuid.uuid4().hex}")
        out = run_python(code)
        assert out.returncode == 0, f"{snippet}\n{out.stdout}{out.stderr}"


@pytest.mark.parametrize("name", TRITON_EXAMPLES)
def test_triton_client_example(serve, name):
    folder = os.environ.get("TRITON_CLIENT_EXAMPLES")
    if not folder:
        pytest.skip("TRITON_CLIENT_EXAMPLES does not name a copy of tritonclient's "
                    "src/python/examples")
    script = Path(folder) / f"{name}.py"
    assert script.is_file(), f"{script} is missing"
    url = serve.grpc_url if "_grpc_" in name else serve.http_url
    out = run_python("", str(script), "-u", url, cwd=folder)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "FAILED" not in out.stdout, out.stdout


def test_the_images_healthcheck_finds_the_port_it_serves_on(serve):
    """The Dockerfile's HEALTHCHECK (scheduler.healthcheck) against a server on a port
    of its own: healthy, from the server's command line alone."""
    out = run_python("", "-m", "scheduler.healthcheck", str(serve.proc.pid))
    assert out.returncode == 0, out.stderr
    out = run_python("", "-m", "scheduler.healthcheck", "999999999")  # no such process
    assert out.returncode == 1 and "no shmserve process found" in out.stderr
