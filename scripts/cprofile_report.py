#!/usr/bin/env python3
"""Each role's Python, per request, from the profiles a server run with
SHMSERVE_CPROFILE=FOLDER leaves (ROLE-PID.prof, written at its stop): its calls per
request, and the functions that hold the most of its own time, with their calls per
request. Unlike py-spy's samples, the counts are exact and the time a process sleeps
waiting for work is left out (its waits are named and dropped, and so is what it does
once as it starts: imports); cProfile's own cost
inflates every time about twofold, so the times rank, the calls count.

    SHMSERVE_CPROFILE=/tmp/prof shmserve ...   # serve N requests, stop it
    scripts/cprofile_report.py /tmp/prof --requests N [--top 20] [--roles worker]

With `--log SERVER_LOG --model M`, N is the rows model M ran, from the server's exit
summary.
"""

from __future__ import annotations

import argparse
import collections
import pstats
import re
import sys
from pathlib import Path

# where a process sleeps until a message or a client comes: time there is no work
WAITS = ("method 'poll' of 'select.epoll'", "method 'select' of 'select.epoll'",
         "method 'control' of 'select.kqueue'", "built-in method time.sleep",
         "built-in method posix.waitpid", "method 'acquire' of '_thread.lock'",
         "method 'run_forever'", "asyncio/runners.py", "method 'wait' of")
# what a process does once, as it starts (imports, classes, its children, the full
# collection shm.lifecycle.settle_heap makes before serving), not per request
STARTUP = ("<frozen importlib", "marshal.loads", "_imp.", "__build_class__", "fork_exec",
           "io.open_code", "posix.stat", "built-in method gc.collect",
           "built-in method gc.freeze")


def _name(key: tuple[str, int, str]) -> str:
    path, line, func = key
    if path == "~":
        return func
    for root in (str(Path(__file__).resolve().parents[1]) + "/", "site-packages/"):
        if root in path:
            path = path.split(root, 1)[1]
    path = re.sub(r"^.*/lib/python3\.\d+/", "", path)  # the standard library's
    return f"{path}:{line} {func}"


def role_of(path: Path) -> str:
    return path.stem.rsplit("-", 1)[0]


def report(folder: Path, requests: float, top: int, roles: set[str] | None) -> str:
    by_role: dict[str, list[Path]] = collections.defaultdict(list)
    for prof in sorted(folder.glob("*.prof")):
        if roles is None or role_of(prof) in roles:
            by_role[role_of(prof)].append(prof)
    out = [f"# per request ({requests:.0f} requests): calls, own us (profiled), function"]
    for role, files in sorted(by_role.items()):
        own: collections.Counter = collections.Counter()
        calls: collections.Counter = collections.Counter()
        for prof in files:
            for key, (_, ncalls, tottime, _, _) in pstats.Stats(str(prof)).stats.items():
                name = _name(key)
                if any(w in name for w in WAITS + STARTUP):
                    continue
                own[name] += tottime
                calls[name] += ncalls
        total = sum(own.values())
        out.append(f"## {role} ({len(files)} process(es)): {sum(calls.values()) / requests:.1f}"
                   f" calls and {1e6 * total / requests:.1f} us (profiled) per request")
        for name, seconds in own.most_common(top):
            out.append(f"  {calls[name] / requests:7.2f} {1e6 * seconds / requests:8.2f}  "
                       f"{name}")
    return "\n".join(out)


def rows_from_log(log: Path, model: str) -> int:
    found = re.findall(rf"model '{re.escape(model)}' version \d+: (\d+) rows in",
                       log.read_text(errors="replace"))
    if not found:
        raise SystemExit(f"cprofile_report: no exit summary of model '{model}' in {log}")
    return int(found[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", type=Path)
    p.add_argument("--requests", type=float, help="requests the server answered")
    p.add_argument("--log", type=Path, help="the server's log, for its exit summary")
    p.add_argument("--model", help="with --log: the model whose rows count")
    p.add_argument("--top", type=int, default=20)
    p.add_argument("--roles", help="comma-separated: only these (frontend,worker,...)")
    a = p.parse_args()
    if a.requests is None:
        if a.log is None or a.model is None:
            p.error("give --requests, or --log and --model")
        a.requests = rows_from_log(a.log, a.model)
    roles = set(a.roles.split(",")) if a.roles else None
    print(report(a.folder, a.requests, a.top, roles))


if __name__ == "__main__":
    sys.exit(main())
