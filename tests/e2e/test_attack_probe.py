"""scripts/attack_probe.py, run for a second per case against a shmserve it starts: the
rows come out, with the victim's calls on both protocols, the server's memory sampled
and the attacker's fate. This checks the tool works, not how well the server holds."""

import json
import os
import subprocess
import sys

import pytest

from tests.e2e.harness import EXAMPLES, ROOT

pytestmark = pytest.mark.e2e


def test_probe_prints_a_row_per_case(tmp_path):
    """Rule: each selected case yields a row with the victim's gRPC and HTTP calls
    counted, the server's memory sampled and a fate; the table is printed, the JSON
    written, the server stopped and nothing of it left in /dev/shm."""
    extra = ""
    for env, flag in (("SHMSERVE_TEST_GRPC_FRONTEND", "--grpc-frontend"),
                      ("SHMSERVE_TEST_HTTP_FRONTEND", "--http-frontend")):
        if os.environ.get(env):
            extra += f" {flag} {os.environ[env]}"
    cmd = (f"env PYTHONPATH={ROOT} {sys.executable} -m scheduler.main --model-repository "
           "{repo} --http-port {http} --grpc-port {grpc} --metrics-port {metrics} "
           "--http-address 127.0.0.1 --grpc-address 127.0.0.1 --metrics-address 127.0.0.1 "
           "--model-control-mode explicit --load-model identity_fp32 "
           "--allow-client-shm true --frontend-processes 1" + extra)
    out = tmp_path / "probe.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "attack_probe.py"), "--skip", "triton",
         "--shmserve", cmd, "--repo", str(EXAMPLES), "--cases", "cl-te,grpc-4gib-prefix",
         "--duration", "1", "--after", "0.3", "--settle", "5", "--log-dir", str(tmp_path),
         "--json", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads(out.read_text())["servers"]["shmserve"]
    assert [r["case"] for r in rows] == ["grpc-4gib-prefix", "cl-te"]  # table order
    for r in rows:
        for protocol in ("grpc", "http"):
            assert r["victim"][protocol]["ok"] > 0, (protocol, r)
        assert r["memory"]["start"] > 10 << 20 and r["memory"]["peak"] > 0
        assert r["memory"]["series_mib"]
        assert r["fate"] and not r["fate"].startswith("attack failed"), r["fate"]
        assert r["settle_s"] is not None
    assert rows[1]["fate"].startswith("CL+TE: ")
    # a malformed HTTP/1.1 request on its own connection: no call of the victim's
    # failed, from the first of its window on (its clients outlive each window)
    assert rows[1]["victim_first_error"] == {}, rows[1]["victim_first_error"]
    assert "| Content-Length + Transfer-Encoding |" in proc.stdout
    assert "| gRPC length prefix 4 GiB |" in proc.stdout
    pid = int(proc.stdout.split("# started shmserve pid ")[1].split(":")[0])
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"shmserve-{pid:x}")]
    assert "removed" not in proc.stdout  # stopped cleanly: nothing left to clean
