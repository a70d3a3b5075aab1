"""The parts of scripts/gpu_compare.py that need no server and no GPU: the model
repositories it builds, the torch identity's code under our pb_utils, the plan of
phases, the deadline, results.json as rows arrive, the summaries and the copy
counters read from shmserve's log."""

import json
import math
import os
import sys

import numpy as np
import pytest

SCRIPTS = os.path.join(os.path.dirname(__file__), "..", "..", "scripts")
sys.path.insert(0, os.path.abspath(SCRIPTS))

import compare  # noqa: E402
import gpu_compare as gc  # noqa: E402
import gpu_models as models  # noqa: E402
import gpu_report as report  # noqa: E402

from scheduler.repository.config import config_to_json, load_config, normalize, validate  # noqa: E402


def _config(path) -> dict:
    """The config as the scheduler reads it (validated), as JSON."""
    config = normalize(load_config(path))
    validate(config)
    return config_to_json(config)


# --- repositories -----------------------------------------------------------------------


@pytest.fixture
def narrow_mlps(monkeypatch):
    """The MLPs 8 wide instead of 512: the repositories are written by the same code,
    and what these tests check (models, configs, instance kinds) does not depend on
    the width, while 512-2048-512 weights cost ~0.15 s of CPU a repository."""
    monkeypatch.setattr(models, "MLP_WIDTH", 8)


def test_gpu_repositories(tmp_path, narrow_mlps):
    pytest.importorskip("torch")
    repos = models.build(tmp_path, "gpu", "onnxruntime has no CUDA provider")
    # Triton travels with its python backend only: the framework models are ours alone
    assert repos.models("triton") == [models.CPU_IDENTITY, models.TORCH_IDENTITY]
    assert repos.models("shmserve") == sorted([models.CPU_IDENTITY, models.TORCH_IDENTITY,
                                               models.TS_IDENTITY, models.TS_MLP])
    assert repos.skipped == {models.ONNX_MLP: "onnxruntime has no CUDA provider"}
    for server in ("triton", "shmserve"):
        torch_id = _config(repos.paths[server] / models.TORCH_IDENTITY)
        assert [g["kind"] for g in torch_id["instance_group"]] == ["KIND_GPU"]
        assert torch_id["instance_group"][0]["gpus"] == [0]
        assert torch_id["parameters"]["FORCE_CPU_ONLY_INPUT_TENSORS"] == \
            {"string_value": "no"}
        assert torch_id["max_batch_size"] == 0 and torch_id["input"][0]["dims"] == [-1]
        cpu_id = _config(repos.paths[server] / models.CPU_IDENTITY)
        assert {g["kind"] for g in cpu_id["instance_group"]} == {"KIND_CPU"}
    for name in (models.TS_IDENTITY, models.TS_MLP):
        config = _config(repos.paths["shmserve"] / name)
        assert [g["kind"] for g in config["instance_group"]] == ["KIND_GPU"]
        assert (repos.paths["shmserve"] / name / "1" / "model.pt").stat().st_size > 0


def test_cpu_repositories_have_only_cpu_instances(tmp_path, narrow_mlps):
    pytest.importorskip("torch")
    pytest.importorskip("onnx")
    repos = models.build(tmp_path, "cpu", "ignored on cpu")
    assert models.ONNX_MLP in repos.models("shmserve") and not repos.skipped
    for server in ("triton", "shmserve"):
        for name in repos.models(server):
            kinds = {g["kind"] for g in _config(repos.paths[server] / name)["instance_group"]}
            assert kinds == {"KIND_CPU"}, (server, name)
    with pytest.raises(ValueError):
        models.build(tmp_path / "x", "tpu", True)


def test_gpu_repositories_with_onnx_on_cuda(tmp_path, narrow_mlps):
    pytest.importorskip("torch")
    pytest.importorskip("onnx")
    repos = models.build(tmp_path, "gpu", True)
    config = _config(repos.paths["shmserve"] / models.ONNX_MLP)
    assert [g["kind"] for g in config["instance_group"]] == ["KIND_GPU"]
    assert models.ONNX_MLP not in repos.models("triton")


def test_torch_identity_runs_under_our_pb_utils(tmp_path, monkeypatch):
    """The model's code as the server runs it (CPU instance): the output equals the
    input and is a copy of it, through DLPack both ways."""
    pytest.importorskip("torch")
    from workers.python_backend import pb_utils
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", pb_utils)
    scope = {}
    exec(compile(models.TORCH_IDENTITY_PY, "model.py", "exec"), scope)
    model = scope["TritonPythonModel"]()
    model.initialize({"model_instance_kind": "CPU", "model_instance_device_id": "0"})
    x = np.arange(10, dtype=np.float32)
    request = pb_utils.InferenceRequest(inputs=[pb_utils.Tensor("INPUT0", x)],
                                        requested_output_names=["OUTPUT0"], model_name="m")
    (response,) = model.execute([request])
    out = pb_utils.get_output_tensor_by_name(response, "OUTPUT0").as_numpy()
    np.testing.assert_array_equal(out, x)
    assert not np.shares_memory(out, x)


# --- the plan and the deadline ----------------------------------------------------------


def _args(*argv):
    return gc.settle(gc.build_parser().parse_args(["--out", "/nowhere", *argv]))


def test_plan_on_the_gpu():
    args = _args("--triton-cmd", sys.executable)  # a launcher that exists
    assert (args.rounds, args.duration, args.sizes_mib, args.client_processes) == \
        (2, 4.0, [16.0, 64.0], 4)
    phases = gc.plan(args, "cuda", ["shmserve", "triton"], {})
    assert [p.name for p in phases] == ["check_torch", "table", "cclient", "p50", "check_ts",
                                        "ts_identity", "ts_mlp", "onnx_mlp"]
    table = phases[1]
    assert table.servers == ["shmserve", "triton"] and table.rounds == 2
    assert {(p.protocol, p.shape, p.shm, p.concurrency) for p in table.points} == {
        ("grpc", (4 << 20,), "cuda", 1), ("grpc", (4 << 20,), "cuda", 4),
        ("grpc", (16 << 20,), "cuda", 1), ("grpc", (16 << 20,), "cuda", 4)}
    assert not table.verify and phases[0].verify and phases[0].check
    for p in phases[4:]:
        assert p.servers == ["shmserve"]  # Triton has no framework backends here
    assert phases[5].input_name == "INPUT__0" and phases[5].points[0].shape == (1, 4 << 20)
    # the whole run fits in the default deadline, servers' start and stop included
    measuring = sum(p.measurements() * p.cost(args.setup_s) for p in phases)
    assert measuring + 45 + args.reserve_s < args.deadline
    # what is left out of the run is left out of the plan
    fewer = gc.plan(args, "cuda", ["shmserve"], {models.ONNX_MLP: "no CUDA provider"})
    assert "onnx_mlp" not in [p.name for p in fewer]
    assert all(p.servers == ["shmserve"] for p in fewer)
    only = gc.plan(_args("--phases", "table,p50"), "cuda", ["triton"], {})
    assert [(p.name, p.servers) for p in only] == [("table", ["triton"]), ("p50", ["triton"])]


def test_dry_run_settings_and_a_missing_launcher(monkeypatch):
    monkeypatch.delenv("TRITON_CMD", raising=False)
    args = _args("--device", "cpu", "--quick")
    assert (args.rounds, args.duration, args.sizes_mib, args.tool_threads) == \
        (1, 1.5, [1.0, 4.0], 1)
    monkeypatch.setenv("TRITON_CMD", "/no/such/run_triton")
    args = _args()
    assert args.triton_cmd is None and args.triton_cmd_missing == "/no/such/run_triton"
    monkeypatch.delenv("TRITON_CMD")
    assert _args().triton_cmd is None  # on the GPU only $TRITON_CMD or --triton-cmd


def test_clock():
    t = [100.0]
    clock = gc.Clock(60.0, 10.0, now=lambda: t[0])
    assert clock.fits(50.0) and not clock.fits(50.1)
    t[0] += 45
    assert clock.left() == pytest.approx(15.0) and clock.fits(5.0) and not clock.fits(6.0)


def _fake_row(server, pt, rnd, throughput, p50=1.0, cpu=100.0):
    return {"server": server, "point": pt.key(), "round": rnd, "throughput": throughput,
            "p50_ms": p50, "p99_ms": 2 * p50, "client_cpu": 0.5, "errors": 0,
            "mismatches": 0, "requests": 10,
            "cpu_us": {"server": cpu, "frontend": cpu / 2}}


def test_bench_phase_writes_every_row_and_stops_at_the_deadline(tmp_path, monkeypatch):
    t = [0.0]
    calls = []

    def measure_row(pool, server, pt, rnd, **kw):
        calls.append((server, pt.concurrency, rnd, kw["model"], kw["verify"]))
        t[0] += 10.0  # each measurement takes 10 s of the clock
        return _fake_row(server, pt, rnd, 100.0 if server == "triton" else 150.0)
    monkeypatch.setattr(compare, "measure_row", measure_row)
    P = compare.Point
    ph = gc.Phase("table", "t", "m", ["shmserve", "triton"],
                  [P("grpc", (8,), "cuda", 1), P("grpc", (8,), "cuda", 4)], rounds=2,
                  duration=4.0, warmup=1.0)
    args = _args()
    res = report.Results(tmp_path / "results.json", {"device": "gpu"})
    res.phase("table", status="running")
    servers = {"shmserve": "shmserve", "triton": "triton"}
    gc.run_bench_phase(ph, servers, None, res, gc.Clock(1000.0, 30.0, now=lambda: t[0]),
                       args)
    # A B, then B A: each round in the other order, every point on both servers
    assert [(s, c, r) for s, c, r, _, _ in calls] == [
        ("shmserve", 1, 1), ("triton", 1, 1), ("shmserve", 4, 1), ("triton", 4, 1),
        ("triton", 1, 2), ("shmserve", 1, 2), ("triton", 4, 2), ("shmserve", 4, 2)]
    on_disk = json.loads((tmp_path / "results.json").read_text())
    table = on_disk["phases"]["table"]
    assert len(table["rows"]) == 8 and all(r["phase"] == "table" for r in table["rows"])
    assert [e["ratio"]["shmserve"] for e in table["summary"]] == [1.5, 1.5]
    assert table["summary"][0]["label"] == "grpc [8] cuda c=1"
    # little time left: the phase stops before a measurement it has no time for, with
    # what it measured already on disk
    calls.clear()
    res.phase("table2", status="running")
    ph.name = "table2"
    t[0] = 0.0
    with pytest.raises(gc.Deadline):
        gc.run_bench_phase(ph, servers, None, res, gc.Clock(60.0, 30.0, now=lambda: t[0]),
                           args)
    assert len(calls) == 3  # 30 s after the reserve: at 0, 10 and 20 s 7 s fit, at 30 not
    assert len(json.loads((tmp_path / "results.json").read_text())
               ["phases"]["table2"]["rows"]) == 3


def test_run_phases_goes_on_past_a_failed_phase_and_skips_the_rest_at_the_deadline(
        tmp_path, monkeypatch):
    class Pool:
        def __init__(self, n):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass
    monkeypatch.setattr(gc.bench, "ClientPool", Pool)
    t = [0.0]

    def measure_row(pool, server, pt, rnd, **kw):
        if kw["model"] == "broken":
            raise KeyError("a bug in one phase")
        t[0] += 10.0
        return _fake_row(server, pt, rnd, 100.0)
    monkeypatch.setattr(compare, "measure_row", measure_row)
    P = compare.Point
    point = [P("grpc", (1, 16), "none", 1)]
    phases = [gc.Phase("one", "1", "broken", ["shmserve"], point),
              gc.Phase("two", "2", "m", ["shmserve", "triton"], point),
              gc.Phase("three", "3", "m", ["shmserve"], point * 5),
              gc.Phase("four", "4", "m", ["shmserve"], point)]
    res = report.Results(tmp_path / "results.json", {})
    ready = {"started": True, "models": {"broken": {"state": "READY", "reason": ""},
                                         "m": {"state": "READY", "reason": ""}}}
    res.data["servers"] = {"shmserve": ready, "triton": {
        "started": True, "models": {"m": {"state": "UNAVAILABLE", "reason": "no torch"}}}}
    clock = gc.Clock(70.0, 20.0, now=lambda: t[0])
    status = gc.run_phases(phases, {"shmserve": "S", "triton": "T"}, res, clock, _args(),
                           tmp_path)
    got = {n: (p["status"], len(p["rows"])) for n, p in res.data["phases"].items()}
    assert status == "deadline"
    assert got == {"one": ("failed: KeyError: 'a bug in one phase'", 0),
                   "two": ("done", 1),  # Triton left out: its model did not load
                   # 50 s after the reserve, 10 s a row, 6 s asked: rows at 10-40 s
                   "three": ("partial: deadline", 4), "four": ("skipped: deadline", 0)}
    assert res.data["phases"]["two"]["left_out"] == {"triton": "model m: UNAVAILABLE no torch"}
    assert json.loads((tmp_path / "results.json").read_text())["phases"]["four"]["status"] \
        == "skipped: deadline"


# --- results and summaries --------------------------------------------------------------


def test_results_file_is_valid_json_at_every_step(tmp_path):
    res = report.Results(tmp_path / "results.json", {"x": math.nan})
    res.phase("p", status="running")
    res.add_row("p", {"throughput": math.inf, "cpu_us": {"server": math.nan}})
    data = json.loads((tmp_path / "results.json").read_text())  # strict: no NaN tokens
    assert data["meta"] == {"x": None} and data["status"] == "running"
    assert data["phases"]["p"]["rows"] == [{"throughput": None, "cpu_us": {"server": None}}]
    res.set("status", "done")
    assert json.loads((tmp_path / "results.json").read_text())["status"] == "done"
    assert not list(tmp_path.glob("*.tmp"))


def test_bench_summary_reads_shmserve_over_triton():
    P = compare.Point
    points = [P("grpc", (4 << 20,), "cuda", 1), P("http", (1, 16), "none", 4)]
    rows = [_fake_row("shmserve", pt, r, 200.0 + r, cpu=80.0) for pt in points
            for r in (1, 2)]
    rows += [_fake_row("triton", pt, r, 100.0, cpu=60.0) for pt in points for r in (1, 2)]
    summary = report.bench_summary(rows, ["shmserve", "triton"], points, "m")
    assert [e["label"] for e in summary] == ["grpc 16 MiB cuda c=1", "http [1,16] c=4"]
    assert summary[0]["ratio"]["shmserve"] == pytest.approx(2.015)
    assert summary[0]["servers"]["triton"]["cpu_us"]["server"] == 60.0
    assert summary[0]["model"] == "m"
    alone = report.bench_summary(rows[:4], ["shmserve"], points, "m")
    assert alone[0]["ratio"] == {} and list(alone[0]["servers"]) == ["shmserve"]
    assert report.bench_summary([], ["shmserve"], points, "m") == []


def test_cclient_summary_and_table():
    rows = [{"server": s, "protocol": proto, "round": r, "requests": 1000,
             "infer_per_s": base * (2 if s == "shmserve" else 1) + r,
             "cpu_us_per_request": {"frontend": 100.0} if s == "shmserve"
             else {"tritonserver": 150.0},
             "server_cpu_us_per_request": 100.0 if s == "shmserve" else 150.0,
             "client_cpu_us_per_request": 20.0}
            for s in ("shmserve", "triton") for proto, base in (("http", 10000),
                                                                ("grpc", 20000))
            for r in (1, 2)]
    rows.append({"server": "triton", "protocol": "grpc", "round": 3, "requests": 0,
                 "infer_per_s": 0.0, "error": "h2load failed"})  # left out of the means
    summary = report.cclient_summary(rows)
    assert [(e["tool"], e["protocol"]) for e in summary] == [("h2load", "grpc"),
                                                             ("wrk", "http")]
    grpc = summary[0]
    assert grpc["servers"]["triton"]["throughput"] == pytest.approx(20001.5)
    assert grpc["ratio"]["shmserve"] == pytest.approx(40001.5 / 20001.5)
    assert grpc["servers"]["shmserve"]["cpu_us"] == {"frontend": 100.0, "server": 100.0}
    text = report.format_cclient(summary)
    assert "shmserve / Triton 2.00x" in text and "frontend 100" in text


def test_copies_from_shmserves_exit_summary():
    log = ("INFO model 'ts_identity_gpu' version 1: 12 rows in 12 batches; batch sizes "
           "{1:12}; bytes copied host=0 h2d=0 d2h=0 d2d=805306368\n"
           "INFO model 'ts_mlp_gpu' version 1: 30 rows in 9 batches; batch sizes "
           "{1:3, 4:6}; bytes copied host=0 h2d=61440 d2h=61440 d2d=0\n"
           "INFO model 'empty' version 1: 0 rows in 0 batches; batch sizes {}; bytes "
           "copied host=0 h2d=0 d2h=0 d2d=0\n")
    copies = report.copies_from_log(log)
    assert copies["ts_identity_gpu"] == {"rows": 12, "batches": 12, "batch_sizes": {1: 12},
                                         "host": 0, "h2d": 0, "d2h": 0, "d2d": 805306368}
    assert copies["ts_mlp_gpu"]["batch_sizes"] == {1: 3, 4: 6}
    assert copies["empty"]["batch_sizes"] == {}


def test_plot_rows_and_png(tmp_path):
    data = {"meta": {"gpu": "H100"}, "phases": {
        "check_torch": {"check": True, "summary": [{"label": "x", "servers": {}}]},
        "table": {"title": "table", "summary": [
            {"label": "grpc 16 MiB cuda c=1", "servers": {
                "triton": {"throughput": 900.0, "p50_ms": 1.0, "cpu_us": {"server": 700.0}},
                "shmserve": {"throughput": 800.0, "p50_ms": 1.2,
                             "cpu_us": {"server": 900.0}}}}]},
        "p50": {"title": "p50", "summary": [
            {"label": "http [1,16] c=1", "servers": {
                "triton": {"throughput": 1.0, "p50_ms": 0.5, "cpu_us": {}}}}]},
        "cclient": {"status": "skipped: neither wrk nor h2load", "summary": []}}}
    rows = report.plot_rows(data)
    assert [(title, what) for title, what, _ in rows] == [("table", "infer/s"),
                                                          ("p50", "p50 ms")]
    assert rows[0][2] == [("grpc 16 MiB cuda c=1",
                           {"triton": (900.0, 700.0), "shmserve": (800.0, 900.0)})]
    assert rows[1][2][0][1] == {"triton": (0.5, None)}
    pytest.importorskip("matplotlib")
    report.plot(data, tmp_path / "gpu.png")
    assert (tmp_path / "gpu.png").read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError):
        report.plot({"phases": {}}, tmp_path / "none.png")
