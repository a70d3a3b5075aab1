#!/usr/bin/env python3
"""Send a seeded corpus of malformed requests (tests/data/fuzz_cases.py) to a running
server over HTTP and gRPC; print the cases and outcomes per class, and write JSON.

The server must serve examples/model_repository (identity_fp32, add_sub, string_upper).
For the real Triton, copy it out of the checkout first (a real Triton must not run
with a shmserve checkout as its cwd or repository neighbour):

    scripts/fuzz --repository-copy /tmp/fuzz_repo
    setsid /tmp/anchors/bin/run_triton_anchor /tmp/fuzz_repo 18300 18301 18302 \\
        --http-address 127.0.0.1 --grpc-address 127.0.0.1 --metrics-address 127.0.0.1 &
    scripts/fuzz --http-port 18300 --grpc-port 18301 --cases 3000 --seed 11 \\
        --restart ./restart_triton.sh --out /tmp/fuzz_triton.json

`--restart CMD` runs CMD (a shell command of yours that stops what is left of the
server, starts it again and returns once it is ready) when the server dies, so that the run goes on and names the case that
killed it; without it the run stops there. `--compare FILE` prints this run's outcomes
per class beside FILE's (the same seed and count), and the classes of cases whose
outcome differs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from collections import Counter

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from tests.data import fuzz_cases  # noqa: E402
from error_table import server_version  # noqa: E402  (this folder, as a script's)

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples",
                        "model_repository")


def _cell(counter: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counter.items(), key=lambda kv: -kv[1]))


def print_table(docs: list[dict], out=sys.stdout) -> None:
    """Markdown: one row per class, the case count, then each run's outcomes."""
    head = ["class", "cases"] + [d["server"] for d in docs]
    print("| " + " | ".join(head) + " |", file=out)
    print("|" + "---|" * len(head), file=out)
    total = Counter()
    for cls in fuzz_cases.CLASSES:
        cells = [d["per_class"].get(cls, {}) for d in docs]
        n = sum(cells[0].values())
        if not n:
            continue
        total["cases"] += n
        print(f"| {cls} | {n} | " + " | ".join(_cell(c) for c in cells) + " |", file=out)
    print(f"| all | {total['cases']} | " + " | ".join(
        _cell(Counter(r["outcome"] for r in d["results"])) for d in docs) + " |", file=out)
    for d in docs:
        bad = [c for c in d["checks"] if c["failures"]]
        print(f"\n{d['server']}: {len(d['checks'])} valid-request checks, {len(bad)} failed; "
              f"{sum(not r['allowed'] for r in d['results'])} outcomes outside the case's "
              f"allowed set; {d['seconds']} s", file=out)


def print_differences(a: dict, b: dict, out=sys.stdout, examples: int = 1) -> None:
    """Cases whose outcome differs, grouped by (class, a's outcome, b's outcome)."""
    groups: dict[tuple, list] = {}
    for ra, rb in zip(a["results"], b["results"]):
        if ra["outcome"] != rb["outcome"]:
            groups.setdefault((ra["cls"], ra["outcome"], rb["outcome"]), []).append((ra, rb))
    print(f"\n| class | {a['server']} | {b['server']} | cases | e.g. (case: note) |", file=out)
    print("|---|---|---|---|---|", file=out)
    for (cls, oa, ob), rows in sorted(groups.items(), key=lambda kv: (kv[0][0], -len(kv[1]))):
        eg = "; ".join(f"{ra['id']}: {ra['note'][:60]}" for ra, _ in rows[:examples])
        print(f"| {cls} | {oa} | {ob} | {len(rows)} | {eg} |", file=out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--http-port", type=int)
    p.add_argument("--grpc-port", type=int)
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--cases", type=int, default=3000)
    p.add_argument("--check-every", type=int, default=100,
                   help="send a valid request over each protocol after this many cases")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per case")
    p.add_argument("--server", default="", help="a label stored with the outcomes")
    p.add_argument("--out", help="write the JSON here")
    p.add_argument("--restart", metavar="CMD",
                   help="shell command that restarts the server (ready on return)")
    p.add_argument("--skip", type=int, action="append", default=[],
                   help="a case id not to send (recorded as skipped)")
    p.add_argument("--compare", help="a stored run (JSON) to print beside this one")
    p.add_argument("--summary", metavar="FILE",
                   help="write the cases and outcomes per class of this run (and of "
                        "--compare's) as a small JSON")
    p.add_argument("--show", type=int, default=0,
                   help="print up to this many cases outside their allowed outcomes")
    p.add_argument("--repository-copy", metavar="DIR",
                   help="copy the corpus's model repository to DIR and exit")
    args = p.parse_args(argv)
    if args.repository_copy:
        shutil.copytree(EXAMPLES, args.repository_copy, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
        print(args.repository_copy)
        return 0
    if not (args.http_port and args.grpc_port):
        p.error("--http-port and --grpc-port are required")
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        p.error("the fuzz corpus only goes to a loopback address")

    def revive():
        subprocess.run(args.restart, shell=True, check=True, timeout=300)

    version = server_version(f"{args.host}:{args.http_port}")
    report = fuzz_cases.run(
        fuzz_cases.corpus(args.seed, args.cases), args.host, args.http_port,
        args.grpc_port, check_every=args.check_every, timeout=args.timeout,
        seed=args.seed, revive=revive if args.restart else None, skip=set(args.skip))
    doc = {"server": args.server or version, "version": version, **report.to_json()}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=0)
    docs = [doc]
    if args.compare:
        with open(args.compare) as f:
            other = json.load(f)
        if (other["seed"], other["cases"]) != (doc["seed"], doc["cases"]):
            print(f"warning: {args.compare} ran seed {other['seed']}, {other['cases']} "
                  "cases: the rows do not match case for case", file=sys.stderr)
        docs.append(other)
    print_table(docs)
    if args.summary:
        summary = {"seed": doc["seed"], "cases": doc["cases"], "runs": [
            {k: d[k] for k in ("server", "version", "seconds", "per_class")}
            | {"failed_checks": sum(bool(c["failures"]) for c in d["checks"]),
               "died_on": [r["id"] for r in d["results"] if r["outcome"] == "server died"]}
            for d in docs]}
        with open(args.summary, "w") as f:
            json.dump(summary, f, indent=1)
            f.write("\n")
    if args.compare:
        print_differences(doc, docs[1])
    died = [r for r in report.results if r["outcome"] == "server died"]
    for r in died:
        print(f"case {r['id']} ({r['cls']}: {r['note']}) killed the server")
    for r in report.unexpected()[:args.show]:
        print(f"case {r['id']} {r['cls']}: {r['note'][:70]} -> {r['outcome']} "
              f"{r['message'][:120]}")
    return 1 if died or report.failed_checks() else 0


if __name__ == "__main__":
    sys.exit(main())
