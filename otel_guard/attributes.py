"""The input attribute names under the name the contract gives them (docs/contract.md section 3).

The names live with the rest of span input in :mod:`otel_guard.spans.attributes`; this module
keeps ``otel_guard.attributes`` importable as the contract promises.
"""

from otel_guard.spans.attributes import *  # noqa: F403
from otel_guard.spans.attributes import __all__ as __all__
