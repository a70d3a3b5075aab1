"""A server's processes seen from outside, for the benchmarks: its process tree, each
process's role (from its command line), the CPU time of each role between two samples,
the server found from the port it listens on, and py-spy's top functions of one role.
scripts/bench, scripts/benchkit.py and scripts/bench_mlp.py share these; never imported
by the server's own processes.

Roles of shmserve (every child is `python -m MODULE ...`): `root` (the top
`scheduler.main` that restarts the scheduler), `scheduler`, `frontend N` (`--index N`),
`worker LABEL` (`--name LABEL`: a python instance as `model/version/instance`, or a
device worker such as `cpu worker`). Triton's: `tritonserver`, `python_stub`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections import Counter


def process_tree(root: int) -> list[int]:
    """`root` and every process below it (by parent pid, read from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat:
                children.setdefault(int(stat[1]), []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def _stat(pid: int) -> list[str]:
    """/proc/PID/stat's fields after the command name (state, ppid, ...); [] if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def user_system_seconds(pid: int) -> tuple[float, float] | None:
    """(utime, stime) of `pid`, all its threads: its own code's CPU and the kernel's
    work for it (system calls, wake-ups, page faults); None once it is gone."""
    fields = _stat(pid)
    if len(fields) < 13:
        return None
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of `pid` (all its threads); None once it is gone."""
    both = user_system_seconds(pid)
    return None if both is None else both[0] + both[1]


def module_of(argv: list[str]) -> str:
    """The module a `python -m MODULE` process runs, else 'client' (the coarse role
    the older scripts print)."""
    return argv[argv.index("-m") + 1] if "-m" in argv[:-1] else "client"


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1] if name in argv[:-1] else ""


def role_of(argv: list[str], parent_argv: list[str] | None = None) -> str | None:
    """A process's role from its command line (None: not part of the server, e.g. a
    launcher shell). `parent_argv` tells the scheduler from the root, which run the
    same module."""
    module = module_of(argv)
    if module == "scheduler.main":
        parent = module_of(parent_argv or [])
        return "scheduler" if parent == "scheduler.main" else "root"
    if module == "frontend.main":
        return f"frontend {_flag(argv, '--index') or '?'}"
    if module == "workers.main":
        # the label ends in '#generation', which changes on a restart only
        return f"worker {_flag(argv, '--name').split('#')[0] or '?'}"
    if module != "client":
        return module
    exe = os.path.basename(argv[0]) if argv else ""
    if "tritonserver" in exe:
        return "tritonserver"
    if "stub" in exe:
        return "python_stub"
    if exe in ("bash", "sh", ""):
        return None
    return exe


def describe(pids: list[int]) -> dict[int, str]:
    """pid -> role for the processes of a server's tree (launchers left out). A
    scheduler.main whose parent is not one is the root, unless it has no
    scheduler.main child: then it is a scheduler started on its own."""
    argvs = {pid: cmdline(pid) for pid in pids}
    parents = {pid: int(s[1]) for pid in pids if (s := _stat(pid))}
    has_sched_child = {parents[p] for p, a in argvs.items()
                       if module_of(a) == "scheduler.main" and p in parents}
    out = {}
    for pid, argv in argvs.items():
        if not argv:
            continue
        parent = parents.get(pid)
        role = role_of(argv, argvs.get(parent) or cmdline(parent or 0))
        if role == "root" and pid not in has_sched_child:
            role = "scheduler"
        if role is not None:
            out[pid] = role
    return out


def cpu_by_role(pids: list[int]) -> dict[str, float]:
    """CPU seconds (user + system) of each process, summed by module (scheduler.main,
    frontend.main, workers.main...) or 'client': the coarse roles of the older scripts."""
    out: dict[str, float] = {}
    for pid in pids:
        s = cpu_seconds(pid)
        if s is None:
            continue
        role = module_of(cmdline(pid))
        out[role] = out.get(role, 0.0) + s
    return out


def roles(pids: list[int]) -> dict[str, float]:
    """cpu_by_role, with Triton's processes named by their executable (tritonserver,
    python_stub) and launcher shells left out."""
    out: dict[str, float] = {}
    for pid in pids:
        argv = cmdline(pid)
        s = cpu_seconds(pid)
        if s is None or not argv:
            continue
        role = module_of(argv)
        if role == "client":
            role = role_of(argv)
            if role is None:
                continue
            if role not in ("tritonserver", "python_stub"):
                role = "client"
        out[role] = out.get(role, 0.0) + s
    return out


class RoleSampler:
    """CPU seconds of each process of a server's tree at two moments. The tree is read
    at the first sample (by then every worker runs)."""

    def __init__(self, root_pid: int):
        self.root_pid = root_pid
        self.roles: dict[int, str] = {}

    def sample(self) -> dict[int, float]:
        if not self.roles:
            self.roles = describe(process_tree(self.root_pid))
        return {pid: s for pid in self.roles if (s := cpu_seconds(pid)) is not None}

    def per_role(self, before: dict, after: dict) -> dict[str, float]:
        """CPU seconds by role between two samples (processes in both only; several
        processes with one role, e.g. Triton's stubs, are added up)."""
        out: dict[str, float] = {}
        for pid, s in after.items():
            if pid in before:
                role = self.roles[pid]
                out[role] = out.get(role, 0.0) + s - before[pid]
        return out


def group_roles(cpu: dict[str, float], model: str) -> dict[str, float]:
    """Roles as the report shows them: each frontend and their sum `frontend`, the
    scheduler, the root, each worker of `model` and the device workers (framework
    models) by name, the workers of other models summed as `other workers`."""
    out: dict[str, float] = {}
    fronts = {k: v for k, v in cpu.items() if k.startswith("frontend ")}
    if fronts:
        out["frontend"] = sum(fronts.values())
        out.update(sorted(fronts.items()))
    others = []
    for k, v in sorted(cpu.items()):
        if k in fronts:
            continue
        if k.startswith("worker ") and not (k.startswith(f"worker {model}/")
                                            or k.endswith(" worker")):
            others.append(v)
            continue
        out[k] = v
    if others:
        out["other workers"] = sum(others)
    return out


# ---------------------------------------------------------------------- finding it


def listening_pids(port: int) -> list[int]:
    """The processes holding a listening TCP socket on `port` (any local address),
    found through /proc/net/tcp{,6} and each process's fds; [] if none visible."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    cols = line.split()
                    local, state, inode = cols[1], cols[3], cols[9]
                    if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                        inodes.add(f"socket:[{inode}]")
        except (OSError, StopIteration, IndexError, ValueError):
            continue
    if not inodes:
        return []
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{entry}/fd/{fd}") in inodes:
                    found.append(int(entry))
                    break
            except OSError:
                continue
    return found


def server_root(pid: int) -> int:
    """The top of the server that `pid` belongs to: climb while the parent is a
    server process (scheduler.main, tritonserver), so a frontend leads to the root."""
    while True:
        stat = _stat(pid)
        if not stat:
            return pid
        parent = int(stat[1])
        argv = cmdline(parent)
        if parent <= 1 or not argv:
            return pid
        if module_of(argv) != "scheduler.main" and \
                "tritonserver" not in os.path.basename(argv[0]):
            return pid
        pid = parent


def find_server(port: int) -> int | None:
    """The root pid of the local server listening on `port`, or None."""
    pids = listening_pids(port)
    return server_root(pids[0]) if pids else None


# ---------------------------------------------------------------------- profiling


def pyspy_path() -> str | None:
    """py-spy's executable: beside this interpreter (a venv) or on PATH."""
    import sys
    here = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return here if os.access(here, os.X_OK) else shutil.which("py-spy")


PYSPY_MISSING = ("py-spy not found: `pip install py-spy` (or the `bench` extra, "
                 "`pip install 'shmserve[bench]'`); it samples another process's stacks, "
                 "which needs ptrace rights (root, or CAP_SYS_PTRACE in a container)")


def busiest(pids: list[int], before: dict[int, float], after: dict[int, float]) -> int:
    """Of `pids` (in order of preference), the one that spent the most CPU between two
    samples (pid -> seconds); the first on a tie, or when none was sampled. The bench
    profiles it: the kernel spreads connections over the frontends, so the first
    frontend may be idle while another serves the load."""
    spent = {p: after.get(p, 0.0) - before.get(p, 0.0) for p in pids}
    return max(pids, key=lambda p: (spent[p], -pids.index(p)))


class PySpy:
    """`py-spy record` on one process for `seconds`, its raw (collapsed) stacks kept
    for top_functions()."""

    def __init__(self, pid: int, seconds: float, rate: int = 200, native: bool = False):
        exe = pyspy_path()
        if exe is None:
            raise FileNotFoundError(PYSPY_MISSING)
        self.pid = pid
        fd, self.path = tempfile.mkstemp(prefix="bench-pyspy-", suffix=".txt")
        os.close(fd)
        # native stacks are read with the process paused (py-spy refuses them with
        # --nonblocking), which slows it a little while it is sampled
        mode = ["--native"] if native else ["--nonblocking"]
        self.proc = subprocess.Popen(
            [exe, "record", "--pid", str(pid), "--duration", str(max(1, round(seconds))),
             "--rate", str(rate), "--format", "raw", "--function", *mode,
             "--output", self.path],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def finish(self, timeout: float = 60.0) -> tuple[Counter, Counter, int, str]:
        """(self samples by function, inclusive samples by function, total samples,
        py-spy's complaint if it failed)."""
        try:
            _, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        try:
            with open(self.path) as f:
                text = f.read()
        finally:
            os.unlink(self.path)
        own, incl, total = collapsed_top(text)
        problem = "" if total else (err.decode(errors="replace").strip()[-500:]
                                    or "py-spy recorded no samples")
        return own, incl, total, problem


def collapsed_top(text: str) -> tuple[Counter, Counter, int]:
    """Self and inclusive sample counts per function from collapsed stacks
    ('frame;frame;leaf COUNT' per line, as py-spy --format raw writes)."""
    own, incl, total = Counter(), Counter(), 0
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [f for f in stack.split(";") if f]
        if not frames:
            continue
        total += n
        own[frames[-1]] += n
        for f in set(frames):
            incl[f] += n
    return own, incl, total


def format_top(role: str, pid: int, own: Counter, incl: Counter, total: int,
               n: int = 15) -> str:
    lines = [f"# profile of {role} (pid {pid}): {total} samples; top {n} by own time "
             f"(own% / incl%)"]
    for frame, count in own.most_common(n):
        lines.append(f"  {100 * count / total:5.1f}%  {100 * incl[frame] / total:5.1f}%  "
                     f"{frame}")
    return "\n".join(lines)


def wait_until(t: float, clock=time.perf_counter, sleep=time.sleep) -> None:
    while (left := t - clock()) > 0:
        sleep(min(left, 0.5))
