"""Hooks for the whole suite."""

import gc


def pytest_sessionstart(session):
    # Collection imports a few million long-lived objects (torch, numpy, grpc,
    # protobuf, the test modules) and little garbage: the collector's passes over
    # them, ~1 s, found nothing to free.
    gc.disable()


def pytest_collection_finish(session):
    """What collection made lives until the end of the session. Frozen, it is left out
    of the collector's full passes, each of which walked all of it again (14 of them
    cost ~3 s of the unit suite's ~49 s of CPU). What the tests make is collected as
    before."""
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)
    gc.enable()
