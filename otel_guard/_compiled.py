"""What the optional compiled build (``setup.py``, ``OTEL_GUARD_COMPILED=1``) reads from the
sources, and nothing else needs at run time.

:func:`mypyc_attr` marks the classes that applications may subclass in Python: the compiled build
makes them extension classes, which refuse interpreted subclasses unless told otherwise. Without
``mypy_extensions`` installed (the pure-Python package does not depend on it) it does nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

__all__ = ["mypyc_attr"]

_T = TypeVar("_T")

try:
    from mypy_extensions import mypyc_attr
except ImportError:  # the pure-Python package: nothing to mark

    def mypyc_attr(*attrs: str, **kwattrs: object) -> Callable[[_T], _T]:
        def mark(cls: _T) -> _T:
            return cls

        return mark
