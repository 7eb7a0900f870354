"""Settings shared by the whole suite."""

from hypothesis import HealthCheck, settings

# Speed is measured in benchmarks/, never asserted by a test: hypothesis's per-example deadline
# and its too-slow health check are timings, and on a shared machine they fail for load alone.
settings.register_profile("otel_guard", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("otel_guard")
