"""How many CPUs this process may really use: its affinity, capped by the cgroup CPU
quota a container runtime sets (`docker --cpus`, a Kubernetes CPU limit).

os.cpu_count() and even sched_getaffinity() see the node's CPUs: a pod limited to 2
CPUs on a 64-core node would start 32 frontends that the quota then throttles. The
rules are the JVM's and Go's (1.25): the quota is quota/period of the cgroup's CPU
controller, rounded up; every cgroup from the process's own up to the root may set
one, and the smallest counts; "max" (v2) or -1 (v1) is none. The scheduler sizes
the default frontend count by it, the onnxruntime backend its intra-op threads (so it
lives in shm/, which both import)."""

from __future__ import annotations

import math
from pathlib import Path

PROC_SELF_CGROUP = "/proc/self/cgroup"
CGROUP_ROOT = "/sys/fs/cgroup"


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _own_and_parents(mount: Path, cgroup_path: str) -> list[Path]:
    """The process's cgroup directory and each parent up to the mount. Inside a
    container the path /proc/self/cgroup names may be the host's, not under this
    mount (no cgroup namespace): then the mount itself is the container's cgroup."""
    rel = cgroup_path.strip("/")
    own = mount / rel if rel else mount
    if not own.is_dir():
        return [mount]
    dirs = [own]
    while dirs[-1] != mount:
        dirs.append(dirs[-1].parent)
    return dirs


def _v2_quota(mount: Path, cgroup_path: str) -> float | None:
    limits = []
    for d in _own_and_parents(mount, cgroup_path):
        text = _read(d / "cpu.max")
        if not text:
            continue
        quota, _, period = text.partition(" ")
        if quota != "max" and period:
            try:
                if int(period) > 0 and int(quota) > 0:
                    limits.append(int(quota) / int(period))
            except ValueError:
                continue
    return min(limits) if limits else None


def _v1_quota(mount: Path, cgroup_path: str) -> float | None:
    limits = []
    for d in _own_and_parents(mount, cgroup_path):
        quota, period = _read(d / "cpu.cfs_quota_us"), _read(d / "cpu.cfs_period_us")
        try:
            if quota and period and int(quota) > 0 and int(period) > 0:
                limits.append(int(quota) / int(period))
        except ValueError:
            continue
    return min(limits) if limits else None


def cgroup_cpu_quota(proc_self_cgroup: str = PROC_SELF_CGROUP,
                     cgroup_root: str = CGROUP_ROOT) -> float | None:
    """The CPU quota of this process's cgroups in CPUs (1.5 for 150000/100000), or
    None where no cgroup sets one or none can be read."""
    text = _read(Path(proc_self_cgroup))
    if not text:
        return None
    root = Path(cgroup_root)
    for line in text.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":  # v2, the unified hierarchy
            if (root / "cgroup.controllers").exists():
                return _v2_quota(root, path)
        elif "cpu" in controllers.split(","):  # v1: cpu (often with cpuacct)
            for name in (controllers, "cpu", "cpu,cpuacct", "cpuacct,cpu"):
                if (root / name / "cpu.cfs_quota_us").exists():
                    return _v1_quota(root / name, path)
    return None


def usable_cpus(cpus: int, quota: float | None) -> int:
    """Of `cpus` CPUs to run on, how many the quota lets the server keep busy: the
    quota rounded up (a 1.5-CPU quota runs two threads at 75%), at least one."""
    if quota is not None:
        cpus = min(cpus, math.ceil(quota))
    return max(1, cpus)
