"""Settings shared by the whole suite."""

import os

from hypothesis import HealthCheck, settings

# Speed is measured in benchmarks/, never asserted by a test: hypothesis's per-example deadline
# and its too-slow health check are timings, and on a shared machine they fail for load alone.
settings.register_profile("otel_guard", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("otel_guard")

MAX_WORKERS = 4


def pytest_xdist_auto_num_workers(config: object) -> int:
    """``-n auto`` (pyproject's addopts): one worker per core, at most ``MAX_WORKERS``. Each
    worker imports the frameworks of the files it runs (some hundreds of MB), and a file runs on
    one worker, the longest (the state-loss state machines) for about 2.5 of the 4.5 minutes
    the suite takes on two cores: more workers would add memory, not much speed."""
    return max(1, min(os.cpu_count() or 1, MAX_WORKERS))
