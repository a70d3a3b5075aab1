"""The cgroup CPU quota, read from fake /proc/self/cgroup and /sys/fs/cgroup trees, and
the frontend count it caps."""

from pathlib import Path

import pytest

from shm.cpu_quota import cgroup_cpu_quota, usable_cpus


def tree(tmp_path: Path, proc_cgroup: str, files: dict[str, str]) -> tuple[str, str]:
    """Writes the fake files; returns (proc_self_cgroup, cgroup_root)."""
    root = tmp_path / "cgroup"
    root.mkdir()
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    proc = tmp_path / "proc_self_cgroup"
    proc.write_text(proc_cgroup)
    return str(proc), str(root)


V2 = "0::/kubepods/pod1/ctr\n"


def test_v2_quota_of_the_process_cgroup(tmp_path):
    paths = tree(tmp_path, V2, {"cgroup.controllers": "cpu memory",
                                "kubepods/pod1/ctr/cpu.max": "200000 100000\n"})
    assert cgroup_cpu_quota(*paths) == 2.0


def test_v2_the_smallest_quota_up_the_hierarchy_counts(tmp_path):
    paths = tree(tmp_path, V2, {"cgroup.controllers": "cpu",
                                "kubepods/pod1/ctr/cpu.max": "max 100000",
                                "kubepods/pod1/cpu.max": "150000 100000",
                                "kubepods/cpu.max": "800000 100000"})
    assert cgroup_cpu_quota(*paths) == 1.5


def test_v2_max_everywhere_is_no_quota(tmp_path):
    paths = tree(tmp_path, V2, {"cgroup.controllers": "cpu",
                                "kubepods/pod1/ctr/cpu.max": "max 100000"})
    assert cgroup_cpu_quota(*paths) is None


def test_v2_in_a_container_without_a_cgroup_namespace(tmp_path):
    """/proc/self/cgroup names the host's path, absent under the container's mount:
    the mount itself is the container's cgroup."""
    paths = tree(tmp_path, "0::/system.slice/docker-abc.scope\n",
                 {"cgroup.controllers": "cpu", "cpu.max": "100000 100000"})
    assert cgroup_cpu_quota(*paths) == 1.0


def test_v1_cfs_quota_and_period(tmp_path):
    proc = "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/\n"
    paths = tree(tmp_path, proc, {"cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "50000",
                                  "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000",
                                  "cpu,cpuacct/cpu.cfs_quota_us": "-1",
                                  "cpu,cpuacct/cpu.cfs_period_us": "100000"})
    assert cgroup_cpu_quota(*paths) == 0.5


def test_v1_unlimited_is_no_quota(tmp_path):
    paths = tree(tmp_path, "3:cpu:/\n", {"cpu/cpu.cfs_quota_us": "-1",
                                         "cpu/cpu.cfs_period_us": "100000"})
    assert cgroup_cpu_quota(*paths) is None


def test_nothing_readable_is_no_quota(tmp_path):
    assert cgroup_cpu_quota(str(tmp_path / "absent"), str(tmp_path)) is None
    paths = tree(tmp_path, "0::/\n", {})  # v2 line, but no cgroup2 mount there
    assert cgroup_cpu_quota(*paths) is None


@pytest.mark.parametrize("cpus, quota, usable", [
    (64, 2.0, 2), (64, 1.5, 2), (64, 0.5, 1), (4, 8.0, 4), (16, None, 16), (1, None, 1)])
def test_usable_cpus(cpus, quota, usable):
    assert usable_cpus(cpus, quota) == usable


def test_the_default_frontend_count_follows_the_quota(monkeypatch):
    """A pod limited to 2 CPUs on a 64-core node starts one frontend, not 32."""
    import scheduler.cli as cli
    monkeypatch.setattr(cli, "available_cpus", lambda: set(range(64)))
    monkeypatch.setattr(cli, "cgroup_cpu_quota", lambda: 2.0)
    assert cli.parse_args(["--model-repository", "/m"]).frontend_processes == 1
    monkeypatch.setattr(cli, "cgroup_cpu_quota", lambda: 8.0)
    assert cli.parse_args(["--model-repository", "/m"]).frontend_processes == 4
    monkeypatch.setattr(cli, "cgroup_cpu_quota", lambda: None)
    assert cli.parse_args(["--model-repository", "/m"]).frontend_processes == 32
