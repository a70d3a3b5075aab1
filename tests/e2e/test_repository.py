"""Model control and the model-repository extension, end to end over HTTP and gRPC:
the none, explicit and poll modes, index states, config and file overrides, unload with
and without dependents, and reloads without downtime. Statuses and messages are those
the real Triton 2.51 answered for the same calls (see the closing note of issue 11)."""

from __future__ import annotations

import base64
import json
import re
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from tests.e2e.clients import PROTOCOLS, client, infer_input
from tests.e2e.harness import ROOT, ServerProcess, wait_until

pytestmark = pytest.mark.e2e

REPO = ROOT / "tests" / "models_repository"
MODEL_PY = (REPO / "scaled" / "1" / "model.py").read_bytes()


def scaled_config(name: str, scale: float, policy: dict | None = None, **params: str) -> str:
    """A JSON ModelConfig for the `scaled` model code, as the load API's `config`."""
    parameters = {"scale": {"string_value": str(scale)}}
    parameters.update({k: {"string_value": v} for k, v in params.items()})
    return json.dumps({**({"version_policy": policy} if policy else {}),
        "name": name, "backend": "python", "max_batch_size": 0,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1, -1]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1, -1]}],
        "instance_group": [{"count": 1, "kind": "KIND_CPU"}],
        "parameters": parameters})


def index(server, protocol, ready=False) -> list[dict]:
    """The index as plain dicts, whichever protocol asked."""
    c = client(server, protocol)
    if protocol == "http":
        return c.get_model_repository_index() if not ready else _http_index(server, ready)
    rows = c.get_model_repository_index(as_json=True).get("models", [])
    if ready:  # tritonclient's gRPC call has no `ready`: ask with the stub
        from tritonclient.grpc import service_pb2
        request = service_pb2.RepositoryIndexRequest(ready=True)
        rows = [_row(m) for m in c._client_stub.RepositoryIndex(request).models]
    return rows


def _row(m) -> dict:
    row = {"name": m.name}
    for key in ("version", "state", "reason"):
        if getattr(m, key):
            row[key] = getattr(m, key)
    return row


def _http_index(server, ready: bool) -> list[dict]:
    import urllib.request
    req = urllib.request.Request(f"http://{server.http_url}/v2/repository/index",
                                 data=json.dumps({"ready": ready}).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def entry(rows, name):
    found = [r for r in rows if r["name"] == name]
    assert len(found) == 1, rows
    return found[0]


def infer(server, protocol, model="scaled", value=1.0, input_name="INPUT0",
          output_name="OUTPUT0"):
    x = np.full((1, 2), value, dtype=np.float32)
    r = client(server, protocol).infer(model, [infer_input(protocol, input_name, x, "FP32")])
    return float(r.as_numpy(output_name)[0, 0])


def explicit_repo_root(server) -> Path:
    return Path(server.argv[server.argv.index("--model-repository") + 1])


def error_of(fn, *args, **kwargs) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as e:
        fn(*args, **kwargs)
    return e.value


def code_of(protocol, err) -> str:
    """HTTP status as a string, or the gRPC status name."""
    return str(err.status()) if protocol == "http" else err.status().replace("StatusCode.", "")


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    path = tmp_path_factory.mktemp("repo") / "models"
    shutil.copytree(REPO, path)
    return path


@pytest.fixture(scope="module")
def explicit(repo, tmp_path_factory):
    """Explicit mode, `scaled` loaded at start, two frontends (each must learn of every
    load and unload)."""
    markers = tmp_path_factory.mktemp("markers")
    temp = tmp_path_factory.mktemp("tmp")  # where its state and a load's files go
    srv = ServerProcess(repo, "--model-control-mode=explicit", "--load-model", "scaled",
                        frontends=2, log_dir=tmp_path_factory.mktemp("logs"),
                        env={"SHMSERVE_TEST_MARKER_DIR": str(markers),
                             "TMPDIR": str(temp)})
    srv.markers, srv.temp = markers, temp
    yield from srv.serve()


@pytest.fixture(autouse=True)
def _reset_scaled(request):
    """Tests on the explicit server leave `scaled` as they found it: loaded from its
    directory (a no-op when it already is)."""
    yield
    if "explicit" in request.fixturenames:
        srv = request.getfixturevalue("explicit")
        client(srv, "http").load_model("scaled")


# -- none mode ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def none_server(tmp_path_factory):
    srv = ServerProcess(REPO, log_dir=tmp_path_factory.mktemp("none-logs"))
    yield from srv.serve()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_none_mode_loads_everything_and_refuses_load_and_unload(none_server, protocol):
    """Rule: in none mode every model loads at start and the index shows them READY;
    load and unload are refused with Triton's 503 / UNAVAILABLE and its message."""
    rows = index(none_server, protocol)
    assert {r["name"]: r.get("state") for r in rows} == {
        "scaled": "READY", "scaled_b": "READY", "scaled_ens": "READY"}
    assert entry(rows, "scaled") == {"name": "scaled", "version": "1", "state": "READY"}
    c = client(none_server, protocol)
    for call in (c.load_model, c.unload_model):
        for model in ("scaled", "nosuch"):
            err = error_of(call, model)
            assert code_of(protocol, err) == ("503" if protocol == "http" else "UNAVAILABLE")
            assert err.message() == ("explicit model load / unload is not allowed if "
                                     "polling is enabled")
    assert infer(none_server, protocol) == 2.0  # still serving


# -- explicit mode ----------------------------------------------------------------------

@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_explicit_index_lists_unloaded_models_by_name(explicit, protocol):
    """Rule: explicit mode loads only --load-model; the index lists every model in the
    repository, one never loaded by its name alone; `ready` keeps READY versions only."""
    rows = index(explicit, protocol)  # the first test on this server: nothing else ran
    assert rows == [{"name": "scaled", "version": "1", "state": "READY"},
                    {"name": "scaled_b"}, {"name": "scaled_ens"}]
    assert index(explicit, protocol, ready=True) == [
        {"name": "scaled", "version": "1", "state": "READY"}]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_load_of_unknown_model_is_tritons_poll_failure(explicit, protocol):
    """Rule: loading a model no repository has answers 500 / INTERNAL, "failed to
    load '<m>', failed to poll from model repository"; unloading it succeeds."""
    c = client(explicit, protocol)
    err = error_of(c.load_model, "nosuch")
    assert code_of(protocol, err) == ("500" if protocol == "http" else "INTERNAL")
    assert err.message() == "failed to load 'nosuch', failed to poll from model repository"
    c.unload_model("nosuch")  # Triton: 200, nothing to do
    assert infer(explicit, protocol) == 2.0


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_unloaded_model_answers_as_triton(explicit, protocol):
    """Rule: after an unload the index shows UNAVAILABLE "unloaded"; metadata and infer
    answer 404 / NOT_FOUND "has no available versions", model ready is false, and the
    server stays ready (strict readiness accepts "unloaded"); a load brings it back."""
    c = client(explicit, protocol)
    c.load_model("scaled_b")
    assert infer(explicit, protocol, "scaled_b") == 3.0
    c.unload_model("scaled_b")
    assert entry(index(explicit, protocol), "scaled_b") == {
        "name": "scaled_b", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}
    want = "Request for unknown model: 'scaled_b' has no available versions"
    for call in (lambda: c.get_model_metadata("scaled_b"),
                 lambda: c.get_model_config("scaled_b"),
                 lambda: infer(explicit, protocol, "scaled_b")):
        err = error_of(call)
        assert code_of(protocol, err) == ("404" if protocol == "http" else "NOT_FOUND")
        assert err.message() == want
    assert not c.is_model_ready("scaled_b")
    assert c.is_server_ready()
    c.load_model("scaled_b")
    assert infer(explicit, protocol, "scaled_b") == 3.0


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_ensemble_loads_with_its_steps_and_unloads_with_dependents(explicit, protocol):
    """Rule: loading an ensemble loads the models of its steps; unloading a step
    unloads the ensemble; unloading the ensemble keeps its steps unless
    unload_dependents is set, which unloads them too."""
    c = client(explicit, protocol)
    c.unload_model("scaled_b")
    c.load_model("scaled_ens")
    rows = index(explicit, protocol, ready=True)
    assert {r["name"] for r in rows} == {"scaled", "scaled_b", "scaled_ens"}
    assert infer(explicit, protocol, "scaled_ens", 1.0, "IN", "OUT") == 6.0
    c.unload_model("scaled_b")  # a step: the ensemble goes with it
    assert entry(index(explicit, protocol), "scaled_ens")["reason"] == "unloaded"
    c.load_model("scaled_ens")
    c.unload_model("scaled_ens")
    assert {r["name"] for r in index(explicit, protocol, ready=True)} == {
        "scaled", "scaled_b"}
    c.load_model("scaled_ens")
    c.unload_model("scaled_ens", unload_dependents=True)
    assert index(explicit, protocol, ready=True) == []
    c.load_model("scaled")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_config_override_reloads_and_bad_override_keeps_serving(explicit, protocol):
    """Rule: the `config` parameter overrides config.pbtxt (the new scale answers);
    an override that does not parse, or names another model, is Triton's poll failure
    (500 / INTERNAL) and the loaded version keeps serving."""
    c = client(explicit, protocol)
    c.load_model("scaled", config=scaled_config("scaled", 5))
    assert infer(explicit, protocol) == 5.0
    for bad in ("{not json", scaled_config("other", 4),
                json.dumps({"input": [{"name": "X", "data_type": "TYPE_BOGUS"}]})):
        err = error_of(c.load_model, "scaled", config=bad)
        assert code_of(protocol, err) == ("500" if protocol == "http" else "INTERNAL")
        assert err.message() == ("failed to load 'scaled', failed to poll from model "
                                 "repository")
    assert infer(explicit, protocol) == 5.0
    c.load_model("scaled")  # its directory again: the file's scale
    assert infer(explicit, protocol) == 2.0


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_file_override_loads_a_model_from_the_request_alone(explicit, protocol):
    """Rule: `file:<version>/<name>` parameters with a `config` load a model that no
    repository has (base64 over HTTP, bytes over gRPC); files without a config are
    Triton's poll failure; the private copy is gone after the unload."""
    c = client(explicit, protocol)
    name = f"from_files_{protocol}"
    err = error_of(c.load_model, name, files={"file:1/model.py": MODEL_PY})
    assert err.message() == f"failed to load '{name}', failed to poll from model repository"
    c.load_model(name, config=scaled_config(name, 4), files={"file:1/model.py": MODEL_PY})
    assert infer(explicit, protocol, name) == 4.0
    assert name not in {r["name"] for r in index(explicit, protocol)}  # as Triton
    private = Path(re.search(rf"model '{name}': 1 file\(s\) from the load request in "
                             r"(\S+)", explicit.log()).group(1))
    assert (private / "1" / "model.py").read_bytes() == MODEL_PY
    assert not str(private).startswith(str(explicit_repo_root(explicit)))
    c.unload_model(name)
    assert not c.is_model_ready(name)
    assert not private.exists()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_load_named_out_of_its_folder_is_refused_and_writes_nothing(explicit, protocol,
                                                                     tmp_path):
    """Rule (issue 25): a load's name named the folder its files were written to, so
    '../x' or an absolute path over gRPC wrote them outside the private folder. A name
    that is not a directory name is refused now, on both protocols, with the code
    Triton gives a load with files that fails (INVALID_ARGUMENT, HTTP 400), and nothing
    is written anywhere. (Over HTTP a name with a slash is no route: 404, as Triton.
    Triton writes a load's files under a folder of its own whatever the name, and
    loads them; we refuse the name.)"""
    c = client(explicit, protocol)
    tag = f"escaped_{protocol}"
    names = [f"../{tag}1", f"../../{tag}2", f"../../../{tag}3", str(tmp_path / f"{tag}4"),
             "..", f"nul\0{tag}5"]
    for name in names:
        err = error_of(c.load_model, name, config=scaled_config("x", 1),
                       files={"file:1/model.py": MODEL_PY})
        if protocol == "http" and "/" in name:
            assert err.status() == "404", (name, err)
            continue
        assert code_of(protocol, err) == ("400" if protocol == "http"
                                          else "INVALID_ARGUMENT"), (name, err)
        shown = name.replace("\0", "%00") if protocol == "http" else name
        assert err.message().startswith((f"load failed for model '{name}': a model name",
                                         f"load failed for model '{shown}': a model "
                                         "name")), (name, err)
    for root in (explicit.temp, tmp_path, explicit.temp.parent):
        leaked = [str(p) for p in root.rglob(f"*{tag}*")]
        assert leaked == [], leaked
    assert infer(explicit, protocol) == 2.0  # and the server serves on


def _pending(server, model: str) -> float:
    import urllib.request
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics",
                                timeout=10) as r:
        text = r.read().decode()
    for line in text.splitlines():
        if line.startswith("nv_inference_pending_request_count{") and \
                f'model="{model}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_unload_drains_queued_and_running_requests(explicit):
    """Rule: an unload lets the requests the model has queued and running finish
    (each succeeds), refuses new ones as Triton refuses an unloaded model, and returns
    once the model has drained."""
    c = client(explicit, "http")
    c.load_model("scaled", config=scaled_config("scaled", 5, delay_ms="300"))
    results, errors = [], []

    def send(protocol):
        try:
            results.append(infer(explicit, protocol))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=send, args=(p,)) for p in PROTOCOLS * 2]
    for t in threads:
        t.start()
    # one instance: one request runs while the other three wait in the queue (waiting
    # for only two let the unload come before the fourth request, which it refused)
    wait_until(lambda: _pending(explicit, "scaled") >= 3, 60, what="queued requests")
    c.unload_model("scaled")
    for t in threads:
        t.join(60)
    assert errors == [] and results == [5.0] * 4
    err = error_of(infer, explicit, "grpc")
    assert err.message() == "Request for unknown model: 'scaled' has no available versions"
    assert entry(index(explicit, "http"), "scaled")["reason"] == "unloaded"


def test_failing_reload_keeps_the_old_version_serving(explicit):
    """Rule (beyond Triton): a reload whose new instances fail to start answers the
    load with Triton's "load failed" error, while the old version keeps serving; the
    index shows it READY with the failure as its reason."""
    c = client(explicit, "http")
    err = error_of(c.load_model, "scaled", config=scaled_config("scaled", 9, fail_init="1"))
    assert err.status() == "400"
    assert err.message().startswith("load failed for model 'scaled': version 1 is at "
                                    "UNAVAILABLE state: ")
    assert "fail_init is set" in err.message()
    for protocol in PROTOCOLS:
        assert infer(explicit, protocol) == 2.0
        row = entry(index(explicit, protocol), "scaled")
        assert row["state"] == "READY"
        assert row["reason"].startswith("reload failed, still serving the previous load")
    assert c.is_server_ready()


def test_two_loads_of_one_model_serialise(explicit):
    """Rule: two loads of the same model at once run one after the other (their
    instances' initialize never overlap) and the last one's config serves."""
    c = client(explicit, "http")
    log = explicit.markers / "scaled-init.log"
    log.unlink(missing_ok=True)
    errors = []

    def load(scale):
        try:
            client(explicit, "http").load_model(
                "scaled", config=scaled_config("scaled", scale, init_delay_ms="700"))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=load, args=(s,)) for s in (11, 12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    runs = sorted(tuple(map(float, line.split())) for line in log.read_text().splitlines())
    runs.sort(key=lambda r: r[1])
    assert len(runs) == 2, runs
    assert runs[0][2] <= runs[1][1], f"initialize of both loads overlapped: {runs}"
    assert infer(explicit, "grpc") == runs[1][0]
    assert c.is_model_ready("scaled")


def test_loads_of_different_models_run_in_parallel(explicit):
    """Rule: loads of two different models do not wait for each other (their
    initialize overlap, within --model-load-thread-count, 4 by default)."""
    c = client(explicit, "http")
    c.unload_model("scaled_b")
    for name in ("scaled", "scaled_b"):
        (explicit.markers / f"{name}-init.log").unlink(missing_ok=True)
    errors = []

    def load(name):
        try:
            client(explicit, "http").load_model(
                name, config=scaled_config(name, 13, init_delay_ms="1500"))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=load, args=(n,)) for n in ("scaled", "scaled_b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    (a_start, a_end), (b_start, b_end) = (
        tuple(map(float, (explicit.markers / f"{n}-init.log").read_text().split()[1:3]))
        for n in ("scaled", "scaled_b"))
    assert a_start < b_end and b_start < a_end, "the two loads ran one after the other"
    c.unload_model("scaled_b")


def test_reload_under_load_fails_no_request(explicit, repo):
    """Rule (beyond Triton): while clients send requests over HTTP and gRPC, a changed
    config.pbtxt is reloaded beside the serving version; no request fails, answers
    switch from the old scale to the new, and an unchanged model is not reloaded."""
    config = repo / "scaled" / "config.pbtxt"
    original = config.read_text()
    stop = threading.Event()
    seen: dict[float, int] = {}
    failures: list[str] = []

    def send(protocol):
        c = client(explicit, protocol)
        x = np.ones((1, 2), dtype=np.float32)
        try:
            while not stop.is_set():
                try:
                    r = c.infer("scaled", [infer_input(protocol, "INPUT0", x, "FP32")])
                    v = float(r.as_numpy("OUTPUT0")[0, 0])
                    seen[v] = seen.get(v, 0) + 1
                except Exception as exc:  # noqa: BLE001 - counted
                    failures.append(f"{protocol}: {exc}")
        finally:
            # on this thread: an HTTP client's gevent pool cannot be joined from
            # another thread's garbage collection (a PytestUnraisableExceptionWarning)
            c.close()

    threads = [threading.Thread(target=send, args=(p,)) for p in PROTOCOLS * 2]
    try:
        for t in threads:
            t.start()
        wait_until(lambda: seen.get(2.0, 0) >= 20, 60, what="requests on the old config")
        config.write_text(original.replace('string_value: "2"', 'string_value: "7"'))
        client(explicit, "http").load_model("scaled")
        after = seen.get(7.0, 0)
        wait_until(lambda: seen.get(7.0, 0) >= after + 20, 60,
                   what="requests on the new config")
    finally:
        stop.set()
        for t in threads:
            t.join(60)
        config.write_text(original)
    assert failures == []
    assert set(seen) == {2.0, 7.0}
    log = explicit.log()
    assert "successfully reloaded 'scaled' version 1" in log
    client(explicit, "http").load_model("scaled")  # the original file is back: reload
    client(explicit, "http").load_model("scaled")  # unchanged now: nothing to do
    assert explicit.log().count("model 'scaled' is unchanged: not reloaded") >= 1
    assert infer(explicit, "grpc") == 2.0


def test_a_new_version_policy_unloads_dropped_versions_and_loads_new_ones(explicit, repo):
    """Rule: a reload whose version policy picks other versions loads the new ones and
    unloads those it no longer picks (UNAVAILABLE "unloaded"), the others serving."""
    shutil.copytree(repo / "scaled" / "1", repo / "scaled" / "2")
    c = client(explicit, "grpc")
    try:
        c.load_model("scaled", config=scaled_config("scaled", 3, policy={"all": {}}))
        assert [(r["version"], r["state"]) for r in index(explicit, "grpc")
                if r["name"] == "scaled"] == [("1", "READY"), ("2", "READY")]
        c.load_model("scaled", config=scaled_config(
            "scaled", 4, policy={"specific": {"versions": [2]}}))
        rows = [r for r in index(explicit, "http") if r["name"] == "scaled"]
        assert rows == [{"name": "scaled", "version": "1", "state": "UNAVAILABLE",
                         "reason": "unloaded"},
                        {"name": "scaled", "version": "2", "state": "READY"}]
        assert infer(explicit, "http") == 4.0
        assert not c.is_model_ready("scaled", "1")
        assert c.is_model_ready("scaled", "2")
    finally:
        shutil.rmtree(repo / "scaled" / "2")
        c.load_model("scaled")  # its directory again: version 1 only
    assert [(r["version"], r["state"]) for r in index(explicit, "grpc")
            if r["name"] == "scaled"] == [("1", "READY"), ("2", "UNAVAILABLE")]


# -- poll mode ----------------------------------------------------------------------------

def test_poll_mode_applies_added_changed_and_removed_models(tmp_path):
    """Rule: in poll mode every poll finds added, changed and removed models and
    loads, reloads and unloads them while serving; the load API is refused."""
    repo = tmp_path / "models"
    shutil.copytree(REPO, repo)
    srv = ServerProcess(repo, "--model-control-mode=poll", "--repository-poll-secs", "0.5",
                        log_dir=tmp_path)
    srv.start()
    try:
        c = client(srv, "grpc")
        err = error_of(c.load_model, "scaled")
        assert err.message() == ("explicit model load / unload is not allowed if polling "
                                 "is enabled")
        assert infer(srv, "http") == 2.0
        shutil.copytree(repo / "scaled", repo / "scaled_c")  # added
        text = (repo / "scaled_c" / "config.pbtxt").read_text()
        (repo / "scaled_c" / "config.pbtxt").write_text(
            text.replace('name: "scaled"', 'name: "scaled_c"'))
        config = repo / "scaled" / "config.pbtxt"  # changed
        config.write_text(config.read_text().replace('string_value: "2"',
                                                     'string_value: "8"'))
        shutil.rmtree(repo / "scaled_ens")  # removed
        wait_until(lambda: c.is_model_ready("scaled_c"), 60, what="the added model")
        wait_until(lambda: infer(srv, "grpc") == 8.0, 60, what="the changed model")
        wait_until(lambda: not c.is_model_ready("scaled_ens"), 60, what="the removed one")
        assert infer(srv, "http", "scaled_c") == 2.0
        assert "scaled_ens" not in {r["name"] for r in index(srv, "http")}
    finally:
        srv.stop_checked()


# -- a restarted scheduler keeps what the API did ---------------------------------------

def test_restarted_scheduler_repeats_the_apis_loads_and_unloads(tmp_path, repo):
    """Rule: after kill -9 of the scheduler the root starts a new one, which serves the
    models the repository API left serving, not only the command line's: a config
    override, a model loaded from the request's files, and an unload all hold; the
    files' private copy is removed when the server stops."""
    import os
    import signal
    srv = ServerProcess(repo, "--model-control-mode=explicit", "--load-model", "scaled",
                        log_dir=tmp_path).start()
    try:
        c = client(srv, "http")
        c.load_model("scaled_b", config=scaled_config("scaled_b", 3))
        c.load_model("restored", config=scaled_config("restored", 4),
                     files={"file:1/model.py": MODEL_PY})
        c.unload_model("scaled")
        private = Path(re.search(r"model 'restored': 1 file\(s\) from the load request in "
                                 r"(\S+)", srv.log()).group(1))
        old = srv.scheduler_pid()
        os.kill(old, signal.SIGKILL)
        wait_until(lambda: srv.scheduler_pid() not in (0, old), 60, what="a new scheduler")

        def restored() -> bool:
            try:
                return client(srv, "http").is_model_ready("restored")
            except Exception:
                return False
        wait_until(restored, 120, what="the file-loaded model back")
        for protocol in PROTOCOLS:
            assert infer(srv, protocol, "scaled_b") == 3.0
            assert infer(srv, protocol, "restored") == 4.0
            assert entry(index(srv, protocol), "scaled")["reason"] == "unloaded"
        assert "restored the unload of 'scaled'" in srv.log()
        assert not private.exists(), "the copy the dead scheduler read is replaced"
    finally:
        srv.stop_checked()
    assert not private.parent.parent.exists(), "the root's state directory is left"
