"""The optional compiled build: ``OTEL_GUARD_COMPILED=1`` compiles the guard's hot path with mypyc.

Without it (the default) the package is pure Python, built from ``pyproject.toml`` alone. With
it, the modules below become extension modules beside their sources; the build needs mypy (which
ships mypyc) and a C compiler, so it is made without build isolation:

    pip install "mypy>=1.10" "setuptools>=77"
    OTEL_GUARD_COMPILED=1 pip install --no-build-isolation .

The telemetry stays Python: its metric callbacks hold it by weak reference, which compiled
classes do not take. benchmarks/README.md gives what the build gains.
"""

from __future__ import annotations

import os

from setuptools import setup

COMPILED_MODULES = [
    "otel_guard/reducer.py",
    "otel_guard/guard/_sdkfields.py",
    "otel_guard/guard/dispatch.py",
    "otel_guard/guard/processor.py",
    "otel_guard/spans/acp.py",
    "otel_guard/spans/assembly.py",
    "otel_guard/spans/attributes.py",
    "otel_guard/spans/events.py",
    "otel_guard/spans/genai.py",
    "otel_guard/spans/openinference.py",
]

if os.environ.get("OTEL_GUARD_COMPILED") == "1":
    from mypyc.build import mypycify

    setup(ext_modules=mypycify(COMPILED_MODULES, opt_level="3"))
else:
    setup()
