"""shmserve-bench with perf_analyzer's command lines against a real server: a sequence
model driven with start/end flags, a decoupled model over the gRPC stream, and the
-f CSV. Windows of half a second: these check what is reported, never how fast."""

import csv
import json
import subprocess
import sys

import pytest

from tests.e2e.harness import ROOT, ServerProcess
from tests.models_sequence.repo import build

pytestmark = pytest.mark.e2e

CONFLICT = "did not end before this sequence start"  # the server's warning


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = build(tmp_path_factory.mktemp("bench-pa-repo"), ["seq_acc"])
    srv = ServerProcess((repo, ROOT / "tests" / "models_decoupled"),
                        log_dir=tmp_path_factory.mktemp("bench-pa"))
    yield from srv.serve()


def run_bench(tmp_path, *argv):
    """shmserve-bench with perf_analyzer's flags; (return code, output, JSON rows)."""
    out = tmp_path / "rows.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench.py"), *argv, "--warmup", "0.1",
         "--json", str(out)],
        cwd=ROOT, timeout=120, capture_output=True, text=True)
    rows = json.loads(out.read_text())["rows"] if out.exists() else []
    return done.returncode, done.stdout + done.stderr, rows


# two data streams of 3 steps for the accumulator, and the running sums it must answer
SEQUENCE_DATA = {
    "data": [[{"INPUT": [1]}, {"INPUT": [2]}, {"INPUT": [3]}],
             [{"INPUT": [4]}, {"INPUT": [5]}, {"INPUT": [6]}]],
    "validation_data": [[{"OUTPUT": [1]}, {"OUTPUT": [3]}, {"OUTPUT": [6]}],
                        [{"OUTPUT": [4]}, {"OUTPUT": [9]}, {"OUTPUT": [15]}]],
}


def test_sequences_carry_start_and_end_flags(server, tmp_path):
    """Rule: each sequence's first request carries START (the server refuses a new
    correlation id without it: an error; and the accumulator's sums, checked against
    the data file's validation_data, restart from each step 1) and its last END (the
    range 1:3 gives two streams one id each, reused for every sequence and again by the
    next point: an id reused before its END makes the server warn of a conflict).
    Sequences of 3 (--sequence-length), stepping through the data file's streams."""
    csv_path, data = tmp_path / "pa.csv", tmp_path / "data.json"
    data.write_text(json.dumps(SEQUENCE_DATA))
    rc, out, rows = run_bench(
        tmp_path, "-m", "seq_acc", "-i", "grpc", "-u", f"127.0.0.1:{server.grpc_port}",
        "--sequence-length", "3", "--sequence-length-variation", "0",
        "--sequence-id-range", "1:3", "--concurrency-range", "1:2", "-p", "500",
        "--input-data", str(data), "-f", str(csv_path))
    assert rc == 0, out
    assert CONFLICT not in server.log()  # the server saw every END
    assert [r["concurrency"] for r in rows] == [1, 2]
    for row in rows:
        assert row["errors"] == 0, row["first_error"]
        assert row["mismatches"] == 0, row
        assert row["sequences"] >= 1 and row["requests"] >= 3, row
        # every sequence is 3 requests; the window cuts at most one open one per stream
        assert abs(row["requests"] - 3 * row["sequences"]) <= 2 * row["concurrency"], row
    lines = csv_path.read_text().splitlines()
    assert lines[0].startswith("Concurrency,Inferences/Second,Client Send,")
    assert sorted(int(r[0]) for r in csv.reader(lines[1:])) == [1, 2]


def test_streaming_reports_first_response_and_responses(server, tmp_path):
    """Rule: --streaming drives a decoupled model over the gRPC stream; each request's
    responses (3: one per element of IN) are read to the final flag; the row has the
    responses/s and the time to the first response, which is no later than the whole
    request's."""
    rc, out, rows = run_bench(
        tmp_path, "-m", "repeat", "-i", "grpc", "-u", f"127.0.0.1:{server.grpc_port}",
        "--streaming", "--shape", "IN:3", "--concurrency-range", "2", "-p", "500")
    assert rc == 0, out
    row = rows[0]
    assert row["errors"] == 0 and row["requests"] > 0, row
    assert row["responses"] == 3 * row["requests"], row
    assert row["responses_per_s"] == pytest.approx(3 * row["throughput"], rel=1e-3)
    assert 0 < row["ttft_p50_ms"] <= row["p50_ms"] + 1e-6
    assert 0 < row["ttft_mean_ms"] <= row["mean_ms"] + 1e-6
    assert "responses/s" in out and "time to first response" in out


def test_decoupled_model_without_streaming_says_what_to_add(server, tmp_path):
    rc, out, rows = run_bench(tmp_path, "-m", "repeat", "-i", "grpc",
                              "-u", f"127.0.0.1:{server.grpc_port}")
    assert rc == 1 and rows == []
    assert "the model is decoupled" in out and "--streaming" in out
