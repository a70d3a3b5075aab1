"""A server's memory as scripts/attack_probe.py counts it: the private RSS of every
process in its tree, plus every shared-memory file the tree maps (or that bears the
server's name prefix in /dev/shm) counted once, by the pages it holds.

Why not RSS summed: a segment mapped by the frontend, the scheduler and a worker
appears in each one's RSS (as RssShmem); summed, it would count three times, and a
segment nobody maps any more (kept, leaked) would not count at all. So each process
gives Rss - RssShmem, and each shm file (keyed by device and inode) gives its allocated
blocks once, whoever maps it."""

from __future__ import annotations

import os
import threading
import time

_SHM_PATHS = ("/dev/shm/", "/memfd:", "/SYSV", "/dev/zero")


def tree_pids(root: int, proc: str = "/proc") -> list[int]:
    """`root` and all its descendants (every thread's children), root first."""
    out, todo, seen = [], [root], set()
    while todo:
        pid = todo.pop(0)
        if pid in seen or not os.path.isdir(f"{proc}/{pid}"):
            continue
        seen.add(pid)
        out.append(pid)
        try:
            tasks = os.listdir(f"{proc}/{pid}/task")
        except OSError:
            tasks = [str(pid)]
        for tid in tasks:
            try:
                with open(f"{proc}/{pid}/task/{tid}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
            except (OSError, ValueError):
                continue
    return out


def status_kib(pid: int, proc: str = "/proc") -> dict[str, int]:
    """VmRSS and RssShmem (KiB) from /proc/PID/status; {} for a process gone."""
    out = {}
    try:
        with open(f"{proc}/{pid}/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "RssShmem"):
                    out[key] = int(rest.split()[0])
    except (OSError, ValueError, IndexError):
        return {}
    return out


def shm_mappings(pid: int, proc: str = "/proc") -> dict[tuple[str, int], tuple[str, str]]:
    """{(device, inode): (path, address range)} of the shared-memory files `pid` maps."""
    out = {}
    try:
        with open(f"{proc}/{pid}/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) < 6:
                    continue
                path = parts[5].rstrip("\n")
                if not path.startswith(_SHM_PATHS):
                    continue
                out.setdefault((parts[3], int(parts[4])), (path, parts[0]))
    except (OSError, ValueError):
        pass
    return out


def _allocated(path: str) -> tuple[int, int] | None:
    """(inode, bytes of pages allocated), or None."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_blocks * 512


def tree_memory(root: int, proc: str = "/proc", shm_dir: str = "/dev/shm",
                prefixes: tuple[str, ...] = ()) -> dict:
    """{'rss': private RSS bytes summed, 'shm': shm bytes counted once, 'total',
    'pids', 'shm_files', 'unresolved'} for the tree under `root` (zeros if gone)."""
    rss, pids, files, unresolved = 0, [], {}, 0
    for pid in tree_pids(root, proc):
        st = status_kib(pid, proc)
        if "VmRSS" not in st:
            continue
        pids.append(pid)
        rss += (st["VmRSS"] - st.get("RssShmem", 0)) * 1024
        for (dev, ino), (path, span) in shm_mappings(pid, proc).items():
            if (dev, ino) in files:
                continue
            name = path.removesuffix(" (deleted)")
            found = None
            if name.startswith("/dev/shm/"):
                found = _allocated(os.path.join(shm_dir, name[len("/dev/shm/"):]))
                if found and found[0] != ino:  # a newer file by that name
                    found = None
            if found is None:  # deleted, memfd, SysV: through the mapping itself
                found = _allocated(f"{proc}/{pid}/map_files/{span}")
            if found is None:
                unresolved += 1
                continue
            files[(dev, ino)] = (name, found[1])
    if prefixes:  # the server's own segments, mapped or not
        seen = {name for name, _ in files.values()}
        try:
            names = os.listdir(shm_dir)
        except OSError:
            names = []
        for n in names:
            full = "/dev/shm/" + n
            if n.startswith(prefixes) and full not in seen:
                found = _allocated(os.path.join(shm_dir, n))
                if found:
                    files[("name", found[0])] = (full, found[1])
    shm = sum(size for _, size in files.values())
    return {"rss": rss, "shm": shm, "total": rss + shm, "pids": pids,
            "shm_files": len(files), "unresolved": unresolved}


class Sampler:
    """Samples tree_memory() every `interval` seconds on a thread; keeps (t, total,
    rss, shm) so that a phase's peak can be read back."""

    def __init__(self, root: int | None, interval: float = 0.2,
                 prefixes: tuple[str, ...] = ()):
        self.root, self.interval, self.prefixes = root, interval, prefixes
        self.samples: list[tuple[float, int, int, int]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "Sampler":
        if self.root is not None:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def sample(self) -> dict | None:
        if self.root is None:
            return None
        m = tree_memory(self.root, prefixes=self.prefixes)
        with self._lock:
            self.samples.append((time.monotonic(), m["total"], m["rss"], m["shm"]))
            if len(self.samples) > 100_000:
                del self.samples[:50_000]
        return m

    def peak(self, since: float, until: float | None = None) -> int | None:
        with self._lock:
            xs = [s[1] for s in self.samples if s[0] >= since
                  and (until is None or s[0] <= until)]
        return max(xs) if xs else None

    def series(self, since: float, until: float | None = None,
               step: float = 0.5) -> list[tuple[float, float]]:
        """(seconds after `since`, MiB) about every `step` seconds, for the JSON."""
        out, last = [], None
        with self._lock:
            for t, total, _, _ in self.samples:
                if t < since or (until is not None and t > until):
                    continue
                if last is None or t - last >= step:
                    out.append((round(t - since, 2), round(total / (1 << 20), 1)))
                    last = t
        return out

    def close(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)
