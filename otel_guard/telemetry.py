"""The guard's output names and values under the name the contract gives them (docs/contract.md
section 5).

They live beside the processor in :mod:`otel_guard.guard.telemetry`; this module keeps
``otel_guard.telemetry`` importable for code and dashboards written against it.
"""

from otel_guard.guard.telemetry import *  # noqa: F403
from otel_guard.guard.telemetry import __all__ as __all__
