"""scripts/bench, the benchmark client, against a real server: it measures and
announces its measured window, which the CPU-sampling benchmarks (scripts/bench_mlp's
run_bench and everything built on scripts/benchkit) sample inside."""

import json
import subprocess
import sys
import time

import pytest

from tests.e2e.harness import ROOT

pytestmark = pytest.mark.e2e


def test_bench_measures_and_announces_its_window(server, tmp_path):
    """Rule: --window-file gets the point's window (CLOCK_MONOTONIC seconds) once the
    clients start: it opens `warmup` after the start and lasts `duration`; the JSON
    row counts requests with no errors."""
    out, window_file = tmp_path / "rows.json", tmp_path / "window.json"
    before = time.monotonic()
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench.py"), "--url",
         f"127.0.0.1:{server.grpc_port}", "--protocol", "grpc", "--model", "identity_fp32",
         "--concurrency", "2", "--duration", "0.5", "--warmup", "0.2", "--json", str(out),
         "--window-file", str(window_file)],
        cwd=ROOT, check=True, timeout=120, stdout=subprocess.DEVNULL)
    after = time.monotonic()
    window = json.loads(window_file.read_text())
    assert before + 0.2 < window["start"] < window["end"] < after
    assert window["end"] - window["start"] == pytest.approx(0.5)
    row = json.loads(out.read_text())["rows"][0]
    assert row["errors"] == 0 and row["requests"] > 0, row
