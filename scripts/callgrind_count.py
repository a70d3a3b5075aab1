"""Instructions per unit of work (a request, a batch) of a benchmark script, counted
under valgrind's callgrind: what the bench scripts' `--instructions` prints.

On a noisy machine a process's CPU time per request moves by tens of percent between
rounds of the same code; the instructions it executes do not. The script runs twice,
for `small` and for `large` units of work, and the difference of the two counts over
the difference of the units leaves out what both runs share (start-up, imports,
warm-up). A count still moves a few percent with timing: which passes of an event loop
carry how much work. Callers take the median of a few."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Callable


def per_unit(argv_of: Callable[[int], list[str]], small: int, large: int,
             units_of: Callable[[int], int] = lambda n: n) -> float:
    """Instructions per unit between `argv_of(small)` and `argv_of(large)` (the
    arguments after the Python interpreter), whose runs do `units_of(n)` units each."""
    if shutil.which("valgrind") is None:
        raise SystemExit("--instructions needs valgrind (apt-get install valgrind)")
    counts = []
    with tempfile.TemporaryDirectory(prefix="callgrind-count-") as folder:
        for n in (small, large):
            out = subprocess.run(
                ["valgrind", "--tool=callgrind", f"--callgrind-out-file={folder}/cg.out",
                 sys.executable, *argv_of(n)],
                capture_output=True, text=True,
                # the same hash seed both times: dict and set layouts, and so the work
                # of lookups, do not differ between the two runs
                env={**os.environ, "PYTHONHASHSEED": "0"})
            found = re.search(r"Collected : (\d+)", out.stderr)
            if out.returncode != 0 or found is None:
                raise SystemExit(f"the run under valgrind failed: {out.stderr[-2000:]}")
            counts.append(int(found.group(1)))
    return (counts[1] - counts[0]) / (units_of(large) - units_of(small))


def median_line(counts: list[float], unit: str) -> str:
    """The line a bench prints for its rounds' counts."""
    counts = sorted(counts)
    return (f"{counts[len(counts) // 2]:,.0f} instructions per {unit} (median; rounds: "
            f"{', '.join(f'{c:,.0f}' for c in counts)})")
