"""scripts/device_checks: a step it does not know is refused before anything is
installed or started (a typo must not spend device time), and the steps it names are
the ones its usage line lists."""

import re
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).parents[2] / "scripts" / "device_checks"


def test_an_unknown_step_is_refused_before_anything_runs(tmp_path):
    got = subprocess.run(["bash", str(SCRIPT), "nonsense"], capture_output=True, text=True,
                         timeout=30, env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "o")})
    assert got.returncode == 2
    steps = "prepare|tests|compare|sweep|profile|wakes|mlp|sync|all"
    assert f"usage: scripts/device_checks {steps}" in got.stderr
    assert not (tmp_path / "o").exists()  # nothing was set up for it


def test_every_step_in_the_usage_line_has_a_branch():
    text = SCRIPT.read_text()
    usage = re.search(r"usage: scripts/device_checks ([a-z|]+)", text).group(1).split("|")
    for step in usage:
        assert re.search(rf"^\s+{step}\)|\"\$step\" = {step}", text, re.M), step


def test_all_skips_a_step_that_would_not_end_in_time(tmp_path):
    """`all` runs sync, wakes and mlp only while each still ends within ALL_S of the
    start: a device call that runs past its limit loses everything it had."""
    fits = re.search(r"^fits\(\) \{.*?^\}", SCRIPT.read_text(), re.M | re.S).group(0)

    def run(gone: int, step_s: int) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", "-c", f"{fits}\nSECONDS={gone}; out={tmp_path}; fits {step_s} sync"],
            capture_output=True, text=True, timeout=30, env={"PATH": "/usr/bin:/bin"})
    assert run(300, 100).returncode == 0
    late = run(500, 100)
    assert late.returncode == 1 and "sync skipped" in late.stdout
    assert "sync skipped" in (tmp_path / "skipped.txt").read_text()
    assert "\n    fits 100 sync && sync_modes" in SCRIPT.read_text()
