"""shm.lifecycle.settle_heap: a serving process's cycle collector leaves the startup
objects alone and does not run while live requests merely come and go, yet cycles made
after it are still collected. Each case runs in its own interpreter: freezing the test
process's heap would change every test after it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# A frontend's startup (its imports), then what serving does to its heap: rounds of 64
# requests that each arrive with a couple of dozen small containers, live while the
# model runs, and go. Prints what the collector did meanwhile.
SERVING = r"""
import gc, json, sys, weakref
import frontend.main  # noqa: F401 (the imports a frontend starts with)
from shm import lifecycle

frozen = lifecycle.settle_heap() if sys.argv[1] == "settled" else 0
runs = [0, 0, 0]
gc.callbacks.append(lambda phase, info: phase == "stop" and runs.__setitem__(
    info["generation"], runs[info["generation"]] + 1))

for _ in range(2_000):
    live = [{"id": i, "inputs": [[j] for j in range(20)], "outputs": []}
            for i in range(64)]
    del live
served = list(runs)


class Node:
    pass


a, b = Node(), Node()
a.other, b.other = b, a
gone = weakref.ref(a)
del a, b
gc.collect()
print(json.dumps({"frozen": frozen, "runs": served, "cycle_freed": gone() is None,
                  "young": gc.get_threshold()[0]}))
"""

# run_loop, which a frontend's and the scheduler's main() end in, settles before the
# loop runs
IN_LOOP = r"""
import gc, json
from shm.lifecycle import GC_YOUNG_THRESHOLD, run_loop

async def look():
    return {"frozen": gc.get_freeze_count(), "young": gc.get_threshold()[0],
            "expected": GC_YOUNG_THRESHOLD}

print(json.dumps(run_loop(look())))
"""


def _run(code: str, *args: str) -> dict:
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                         text=True, timeout=60, cwd=ROOT, env=env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_settled_process_serves_without_collections_and_still_frees_cycles():
    settled = _run(SERVING, "settled")
    default = _run(SERVING, "default")
    # the imports are set aside, and nothing ran while requests came and went
    assert settled["frozen"] > 10_000, settled
    assert settled["runs"] == [0, 0, 0], settled
    # as things were: the live window crosses 700 net allocations over and over
    assert default["runs"][0] > 100, default
    assert default["runs"][2] >= 1, default
    # a cycle made after settling is garbage like any other
    assert settled["cycle_freed"] and default["cycle_freed"]


def test_run_loop_settles_the_heap_before_its_loop():
    seen = _run(IN_LOOP)
    assert seen["frozen"] > 1_000, seen
    assert seen["young"] == seen["expected"] == 5000, seen
