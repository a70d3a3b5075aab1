"""Where a python instance's execute timeout comes from (scheduler/processes/worker_pool.py)."""

import orjson
import pytest

from scheduler.processes.worker_pool import execute_timeout


def _config(value=None) -> bytes:
    params = {} if value is None else {"EXECUTE_TIMEOUT_SECS": {"string_value": value}}
    return orjson.dumps({"name": "m", "backend": "python", "parameters": params})


def test_no_timeout_by_default():
    """As in Triton, an execute has no time limit unless one is configured."""
    assert execute_timeout(_config(), {}) == 0.0


def test_backend_config_sets_it_for_every_python_model():
    assert execute_timeout(_config(), {"execute-timeout-secs": "2.5"}) == 2.5


def test_the_models_own_parameter_wins():
    assert execute_timeout(_config("3"), {"execute-timeout-secs": "10"}) == 3.0
    assert execute_timeout(_config("0"), {"execute-timeout-secs": "10"}) == 0.0


def test_a_value_that_is_no_number_fails_the_load_with_its_text():
    with pytest.raises(RuntimeError, match="'soon'"):
        execute_timeout(_config("soon"), {})
