"""What the framework integrations share: a guard-only provider, quiet bookkeeping, settling.

Private to :mod:`otel_guard.integrations`; imports nothing of any framework.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

from opentelemetry.sdk.trace import TracerProvider

from otel_guard.guard.processor import GuardSpanProcessor
from otel_guard.integrations.producer import ExecutionStatus, TerminalStatus, ToolCall
from otel_guard.spans.attributes import PROMPT_ROUTES

_T = TypeVar("_T")
_V = TypeVar("_V")


def guard_only_provider(guard: GuardSpanProcessor) -> TracerProvider:
    """A provider holding only ``guard``: the guard sees every span, nothing is exported."""
    provider = TracerProvider(shutdown_on_exit=False)  # the guard's owner shuts it down
    provider.add_span_processor(guard)
    return provider


def check_route(route: str | None) -> None:
    if route is not None and route not in PROMPT_ROUTES:
        raise ValueError(f"route must be one of {sorted(PROMPT_ROUTES)}, got {route!r}")


def quietly(logger: logging.Logger, step: Callable[[], _T]) -> _T | None:
    """Run guard bookkeeping; a failure is logged at debug level and never reaches the agent."""
    try:
        return step()
    except Exception:
        # No traceback: frames can hold tool arguments.
        logger.debug("otel_guard: guard bookkeeping failed")
        return None


def settle(
    call: ToolCall,
    execution: ExecutionStatus,
    error_type: str | None = None,
    terminal: TerminalStatus | None = None,
) -> None:
    """Settle and finish ``call`` unless it already finished (a torn-down batch ended it)."""
    if not call.finished:
        call.settle(execution, error_type)
        call.finish(terminal)


def cancel(call: ToolCall) -> None:
    """End ``call`` cancelled (a cancellation wins over whatever its execution did)."""
    if call.cancel():
        call.finish()


class BoundedRuns(Generic[_V]):
    """Open runs by key, oldest first, at most ``limit``; thread-safe.

    A run a framework abandons without its end hook (an exception out of the agent) would keep
    its spans open forever: past the bound the oldest run is handed back to be closed.
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._runs: OrderedDict[str, _V] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, key: str, run: _V) -> list[_V]:
        """Add a run; returns the runs pushed out by the bound (to be closed by the caller)."""
        with self._lock:
            self._runs[key] = run
            evicted: list[_V] = []
            while len(self._runs) > self._limit:
                evicted.append(self._runs.popitem(last=False)[1])
            return evicted

    def get(self, key: object) -> _V | None:
        if not isinstance(key, str):
            return None
        with self._lock:
            return self._runs.get(key)

    def pop(self, key: object) -> _V | None:
        if not isinstance(key, str):
            return None
        with self._lock:
            return self._runs.pop(key, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._runs)
