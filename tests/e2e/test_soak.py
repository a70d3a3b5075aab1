"""scripts/soak.py, run for a few seconds: it starts a server, drives the mixed load
(HTTP, gRPC, shared-memory regions registered and unregistered in a loop) and reports
every server process by role. The long run (10 minutes) is for a quiet machine; this
checks that the harness works and measures what it says, not how fast anything is."""

import json
import subprocess
import sys

import pytest

from tests.e2e.harness import EXAMPLES, ROOT

pytestmark = pytest.mark.e2e


def test_short_soak_reports_every_role_and_no_errors(tmp_path):
    """Rule: the soak report lists the scheduler, each frontend and a worker for every
    served model instance with plausible RSS and fd counts, counts requests through
    both protocols and through shm regions, and ends with zero errors, a clean server
    exit and nothing left in /dev/shm."""
    out = tmp_path / "soak.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "soak.py"), "--seconds", "6",
         "--sample-secs", "2", "--concurrency", "8", "--frontends", "2",
         "--out", str(out), "--log", str(tmp_path / "server.log")],
        cwd=tmp_path, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr + \
        (tmp_path / "server.log").read_text(errors="replace")
    report = json.loads(out.read_text())
    samples = report["samples"]
    assert len(samples) == 3
    models = {p.name for p in EXAMPLES.iterdir() if (p / "config.pbtxt").exists()}
    for sample in samples:
        roles = set(sample["processes"])
        assert {"scheduler", "frontend[0]", "frontend[1]"} <= roles
        served = {r.split()[1].split("/")[0] for r in roles if r.startswith("worker ")}
        assert served == models
        for role, p in sample["processes"].items():
            assert 10 * 1024 < p["rss_kib"] < 4 * 1024 * 1024, (role, p)
            assert 0 < p["anon_kib"] <= p["rss_kib"], (role, p)
            assert 3 <= p["fds"] < 10000, (role, p)
        assert sample["dev_shm"]["server_segments"] >= 1  # arenas in use
    counts = [s["requests"] for s in samples]
    assert counts == sorted(counts) and counts[0] > 0
    last = samples[-1]
    assert last["errors"] == 0 and last["shm_requests"] > 0
    final = report["final"]
    assert final["errors"] == 0 and final["error_messages"] == {}
    assert final["server_exit_code"] == 0
    assert final["server_segments_left"] == [] and final["client_regions_left"] == 0
    assert "scheduler" in proc.stdout and "errors: 0" in proc.stdout
