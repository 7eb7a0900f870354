"""``python -m otel_guard``: the ``otel-guard`` command."""

import sys

from otel_guard.cli import main

sys.exit(main())
