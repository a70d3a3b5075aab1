"""SHMSERVE_CPROFILE: each process's main() runs under cProfile and leaves its
profile behind, a clean exit (SystemExit) included."""

import os
import pstats

import pytest

from shm.lifecycle import PROFILE_ENV, run_main


def _work():
    return sum(i * i for i in range(1000))


def test_without_the_variable_main_runs_plainly(tmp_path, monkeypatch):
    monkeypatch.delenv(PROFILE_ENV, raising=False)
    called = []
    run_main(lambda: called.append(1), "scheduler")
    assert called == [1]


def test_a_profile_is_written_per_process_even_on_sys_exit(tmp_path, monkeypatch):
    folder = tmp_path / "prof"
    monkeypatch.setenv(PROFILE_ENV, str(folder))

    def main():
        _work()
        raise SystemExit(0)

    with pytest.raises(SystemExit):
        run_main(main, "worker")
    [name] = os.listdir(folder)
    assert name == f"worker-{os.getpid()}.prof"
    stats = pstats.Stats(str(folder / name))
    assert any(func[2] == "_work" for func in stats.stats)
