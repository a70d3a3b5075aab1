"""Tests that run scripts or child Python processes, but no server: the wheel build, the
deploy validators, the bench scripts, a process's exit and memory behaviour. Their cost
is mostly the interpreters they start, so they live apart from the in-process unit
suite (tests/unit, tests/loop), which stays a fast inner loop; scripts/test runs them
all (docs/testing.md)."""
