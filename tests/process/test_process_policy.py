"""--process-policy (scheduler.cli.apply_process_policy) applied in a child process,
whose policy and whose own child's are read back: a process's scheduling policy is
its own, so the test process (and the servers later tests start) keep theirs."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


# In the order one process can take them: an unprivileged process may not leave
# SCHED_IDLE, so the case that starts there comes last.
POLICY_CASES = [
    ("SCHED_OTHER", "inherit", "SCHED_OTHER"),
    ("SCHED_OTHER", "batch", "SCHED_BATCH"),
    ("SCHED_IDLE", "batch", "SCHED_IDLE"),  # a policy someone chose is kept
]


@pytest.fixture(scope="module")
def policies():
    """{(start, flag): [the process's policy, its child's]} after apply_process_policy,
    each case begun by setting `start`. Run in one child for all the cases (one
    import of scheduler.cli, not three), so the test process (and the servers later
    tests start) keep their own policy."""
    code = (
        "import os, subprocess, sys\n"
        "from scheduler.cli import apply_process_policy\n"
        "for start, flag in (tuple(c.split(':')) for c in sys.argv[1:]):\n"
        "    os.sched_setscheduler(0, getattr(os, start), os.sched_param(0))\n"
        "    assert apply_process_policy(flag) is None\n"
        "    child = subprocess.run([sys.executable, '-S', '-c', 'import os; "
        "print(os.sched_getscheduler(0))'], capture_output=True, text=True, check=True)\n"
        "    print(start, flag, os.sched_getscheduler(0), child.stdout.strip())\n")
    out = subprocess.run([sys.executable, "-c", code,
                          *(f"{start}:{flag}" for start, flag, _ in POLICY_CASES)],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return {tuple(line.split()[:2]): line.split()[2:] for line in out.stdout.splitlines()}


@pytest.mark.parametrize("start, flag, after", POLICY_CASES)
def test_process_policy(policies, start, flag, after):
    """--process-policy batch moves a normal process to SCHED_BATCH and its children
    inherit it; inherit, or a policy other than the normal one, changes nothing."""
    want = getattr(os, after)
    assert policies[start, flag] == [str(want), str(want)]
