"""Hypothesis profiles for the property-based tests (tests/unit/test_properties_*.py).

`default` and `ci` are deterministic (derandomize: the same examples on every run, so a
failure reproduces and the tests' checks that the strategies reach the decoders' error
paths cannot flake); `ci` is chosen when the CI variable is set. They draw 50 examples
a test (tests that need more ask for a multiple of it): a fixed set that reaches every
error path the tests check, at a third of the unit suite's CPU that 150 cost (issue
24, part 4: the unit suite near 30 s). The hunt for new failures is `fuzz`'s: fresh
random examples, 1500 a test, `HYPOTHESIS_PROFILE=fuzz` for a longer run. No example
database is written (the tests run with the cache disabled).
"""

import os

import pytest
from hypothesis import HealthCheck, settings

_COMMON = dict(deadline=None, database=None, print_blob=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("default", derandomize=True, max_examples=50, **_COMMON)
settings.register_profile("ci", derandomize=True, max_examples=50, **_COMMON)
settings.register_profile("fuzz", derandomize=False, max_examples=1500, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE")
                      or ("ci" if os.environ.get("CI") else "default"))


@pytest.fixture(scope="session")
def certs(tmp_path_factory):
    """One set of test certificates (tests/tls_certs.py) for every unit test that reads
    them: each set is eight openssl runs (~0.2 s of CPU)."""
    from tests.tls_certs import make_certs
    return make_certs(tmp_path_factory.mktemp("certs"))
