"""scripts/cprofile_report.py: the profiles SHMSERVE_CPROFILE leaves, read per role and
per request, with the time a process waits for work left out."""

import cProfile
import gc
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import cprofile_report  # noqa: E402


def handle_one():
    return sum(range(100))


def _profile(folder: Path, name: str, requests: int) -> None:
    gc.collect()  # the test process's garbage (and its finalizers) stay out of it
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(requests):
        handle_one()
        handle_one()
    time.sleep(0.01)  # waiting for the next request: not work
    gc.collect()  # as settle_heap does once before serving: not per request either
    profile.disable()
    profile.dump_stats(str(folder / name))


def test_calls_per_request_by_role_without_the_waits(tmp_path):
    _profile(tmp_path, "worker-11.prof", 50)
    _profile(tmp_path, "worker-12.prof", 50)
    _profile(tmp_path, "frontend-13.prof", 100)
    text = cprofile_report.report(tmp_path, 100, 5, None)
    worker = text.split("## worker")[1]
    assert "(2 process(es))" in worker
    line = next(x for x in worker.splitlines() if "handle_one" in x)
    assert line.split()[0] == "2.00"  # two calls a request, both processes summed
    assert "test_cprofile_report.py" in line and "/work/" not in line
    assert "sleep" not in text and "gc.collect" not in text
    only = cprofile_report.report(tmp_path, 100, 5, {"frontend"})
    assert "## frontend" in only and "## worker" not in only


def test_requests_from_the_servers_exit_summary(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("... model 'm' version 1: 10 rows in 10 batches; ...\n"
                   "... model 'm' version 1: 1234 rows in 600 batches; batch sizes {1:1}\n")
    assert cprofile_report.rows_from_log(log, "m") == 1234
    with pytest.raises(SystemExit, match="no exit summary of model 'x'"):
        cprofile_report.rows_from_log(log, "x")
