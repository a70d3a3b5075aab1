"""The bench's --profile-role sampler: py-spy is run with the flags asked for, and its
collapsed stacks are read back into self and inclusive counts (a fake py-spy here)."""

import os
import stat

from scheduler.bench import procs

FAKE = """#!/bin/sh
# records its arguments, then writes two collapsed stacks where --output says
echo "$@" > "{argv}"
while [ $# -gt 0 ]; do
  if [ "$1" = --output ]; then out=$2; fi
  shift
done
printf 'main (a.py:1);loop (a.py:2);sync (libcudart.so) 3\\nmain (a.py:1);loop (a.py:2) 1\\n' > "$out"
"""


def _fake_pyspy(tmp_path, monkeypatch):
    argv = tmp_path / "argv"
    exe = tmp_path / "py-spy"
    exe.write_text(FAKE.format(argv=argv))
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(procs, "pyspy_path", lambda: str(exe))
    return argv


def test_native_frames_are_asked_for_only_with_profile_native(tmp_path, monkeypatch):
    argv = _fake_pyspy(tmp_path, monkeypatch)
    for native in (False, True):
        own, incl, total, problem = procs.PySpy(os.getpid(), 1, native=native).finish()
        flags = argv.read_text().split()
        assert ("--native" in flags) is native
        assert ("--nonblocking" in flags) is not native  # py-spy refuses the two together
        assert flags[flags.index("--pid") + 1] == str(os.getpid())
        assert (total, problem) == (4, "")
        assert own["sync (libcudart.so)"] == 3 and incl["loop (a.py:2)"] == 4


def test_the_bench_flag_reaches_the_config():
    from scheduler.bench.cli import build_parser, config_from_args
    args = build_parser().parse_args(["-m", "m", "--profile-role", "worker",
                                      "--profile-native"])
    cfg = config_from_args(args)
    assert (cfg.profile_role, cfg.profile_native) == ("worker", True)
    args = build_parser().parse_args(["-m", "m", "--profile-role", "worker"])
    assert config_from_args(args).profile_native is False


def test_the_busiest_process_of_a_role_is_profiled():
    # connections spread over the frontends: the first may be idle while another
    # serves the load (on the H200 the profile of "frontend 0" got 2 samples)
    before = {10: 1.0, 11: 1.0, 12: 1.0}
    assert procs.busiest([10, 11, 12], before, {10: 1.0, 11: 1.3, 12: 1.1}) == 11
    assert procs.busiest([10, 11, 12], before, before) == 10  # a tie: the first
    assert procs.busiest([12, 10], {}, {}) == 12  # nothing sampled: the preferred one
    assert procs.busiest([10, 11], {10: 5.0}, {10: 5.2, 11: 0.1}) == 10
