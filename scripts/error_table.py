#!/usr/bin/env python3
"""Run the error table (tests/data/error_cases.py) against a running server and write
each case's outcome (HTTP status + error text, gRPC code + message) as JSON.

Serve the table's repository first, with the table's flags, for instance the real Triton:

    /tmp/anchors/bin/run_triton_anchor /tmp/models_errors 18100 18101 18102 \\
        --http-address 127.0.0.1 --grpc-address 127.0.0.1 --metrics-address 127.0.0.1 \\
        --exit-on-error=false --strict-readiness=false
    scripts/error_table.py --http 127.0.0.1:18100 --grpc 127.0.0.1:18101 \\
        --server "triton 2.51" --out tests/data/triton_errors_2.51.json

`--repository-copy DIR` copies the table's models to DIR first (a real Triton must not
run with a shmserve checkout as its cwd or repository neighbour). `--compare FILE` prints
the cases whose outcome differs from FILE's.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sys
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from tests.data import error_cases  # noqa: E402


def server_version(http_url: str) -> str:
    try:
        with urllib.request.urlopen(f"http://{http_url}/v2", timeout=10) as r:
            meta = json.loads(r.read())
        return f"{meta.get('name', '?')} {meta.get('version', '?')}"
    except OSError as e:
        return f"unknown ({e})"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--http", help="host:port of the HTTP endpoint")
    p.add_argument("--grpc", help="host:port of the gRPC endpoint")
    p.add_argument("--server", default="", help="a label stored with the outcomes")
    p.add_argument("--out", help="write the JSON here (default: stdout)")
    p.add_argument("--case", action="append", help="run only these case ids")
    p.add_argument("--skip", action="append", default=[], help="leave out these case ids")
    p.add_argument("--protocol", action="append", choices=error_cases.PROTOCOLS,
                   help="run only over these protocols")
    p.add_argument("--merge", help="start from this stored table and replace the cases "
                                   "run now (to run a case that kills a server alone)")
    p.add_argument("--compare", help="a stored table to diff against")
    p.add_argument("--repository-copy", metavar="DIR",
                   help="copy the table's model repository to DIR and exit")
    args = p.parse_args(argv)
    if args.repository_copy:
        shutil.copytree(error_cases.REPOSITORY, args.repository_copy, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
        print(args.repository_copy)
        return 0
    if not (args.http and args.grpc):
        p.error("--http and --grpc are required")
    version = server_version(args.http)  # before the table: a case may stop a server
    table = error_cases.run_table(args.http, args.grpc, args.case, args.skip,
                                  args.protocol)
    if args.merge:
        with open(args.merge) as f:
            base = json.load(f)["cases"]
        for cid, row in table.items():
            base.setdefault(cid, {}).update(row)
        table = {c.id: base[c.id] for c in error_cases.CASES if c.id in base}
    doc = {"server": args.server or version, "version": version,
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
           "flags": list(error_cases.SERVER_FLAGS), "cases": table}
    text = json.dumps(doc, indent=1, sort_keys=False)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    if args.compare:
        with open(args.compare) as f:
            ref = json.load(f)["cases"]
        for cid, row in table.items():
            for proto in error_cases.PROTOCOLS:
                if proto in row and ref.get(cid, {}).get(proto) != row[proto]:
                    print(f"DIFF {cid} [{proto}]\n  ref:  {ref.get(cid, {}).get(proto)}\n"
                          f"  this: {row[proto]}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
