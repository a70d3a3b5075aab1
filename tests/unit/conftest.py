"""Hypothesis profiles for the property-based tests (tests/unit/test_properties_*.py).

`default` and `ci` are deterministic (derandomize: the same examples on every run, so a
failure reproduces and the tests' checks that the strategies reach the decoders' error
paths cannot flake); `ci` is chosen when the CI variable is set. `fuzz` draws fresh
random examples, many more of them: `HYPOTHESIS_PROFILE=fuzz` for a longer hunt. No
example database is written (the tests run with the cache disabled).
"""

import os

from hypothesis import HealthCheck, settings

_COMMON = dict(deadline=None, database=None, print_blob=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("default", derandomize=True, max_examples=150, **_COMMON)
settings.register_profile("ci", derandomize=True, max_examples=150, **_COMMON)
settings.register_profile("fuzz", derandomize=False, max_examples=1500, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE")
                      or ("ci" if os.environ.get("CI") else "default"))
