"""shmserve-bench's --plot draws the points that were measured, and a run in which no
point completed a request writes no plot: it says why, and the run exits 1."""

import math

from scheduler.bench import main as bench


def row(requests: int, errors: int = 0) -> bench.Row:
    nan = math.nan
    return bench.Row(protocol="http", shape=[1, 16], dtype="FP32", concurrency=1,
                     shm="none", requests=requests, seconds=1.0,
                     throughput=float(requests), p50_ms=nan if not requests else 1.0,
                     p90_ms=nan, p99_ms=nan, mean_ms=nan, errors=errors, mismatches=0,
                     client_cpu=0.0, client_processes=1, client_impl="http-gevent",
                     first_error="connection refused" if errors else "")


def outputs(tmp_path, monkeypatch, rows):
    drawn = []
    monkeypatch.setattr(bench, "plot_files",
                        lambda path, runs, extra=(): drawn.append((path, extra)))
    plot = str(tmp_path / "bench.png")
    args = bench.build_parser().parse_args(["--model", "simple", "--plot", plot])
    bench.write_outputs(args, bench.config_from_args(args), rows, [])
    return plot, drawn


def test_a_run_that_failed_completely_writes_no_plot(tmp_path, monkeypatch, capsys):
    rows = [row(0, errors=40), row(0)]
    plot, drawn = outputs(tmp_path, monkeypatch, rows)
    assert drawn == []
    assert (f"no plot written to {plot}: no point completed a request"
            in capsys.readouterr().err)
    assert bench.failed(rows)  # and the run exits 1, each point's reason said


def test_the_plot_has_the_measured_points_only(tmp_path, monkeypatch):
    plot, drawn = outputs(tmp_path, monkeypatch, [row(0, errors=3), row(250)])
    ((path, extra),) = drawn
    assert path == plot
    ((_label, points),) = extra
    assert [p["requests"] for p in points] == [250]
