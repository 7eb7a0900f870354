"""A forked child never inherits a lock held by one of its parent's threads.

Pre-fork servers (gunicorn, multiprocessing's ``fork`` start method) fork while other threads
end spans; only the forking thread survives in the child, so any lock another thread held at
that moment stays held forever unless the child re-creates it.
"""

from __future__ import annotations

import os
import select
import signal
import threading
import time
from collections.abc import Iterator

import pytest
from harness import failing_loop
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.trace import Tracer

from otel_guard import GuardSpanProcessor
from otel_guard.guard.dispatch import guarded_tracer_provider

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")

CHILDREN = 20
THREADS = 4
DEADLINE_SECONDS = 10.0


def _child(tracer: Tracer, guard: GuardSpanProcessor, meters: MeterProvider, done: int) -> None:
    try:
        failing_loop(tracer, f"child-{os.getpid()}", 3, calls=2)
        guard.force_flush()  # emits on this thread: the telemetry's counts lock
        GuardSpanProcessor(meter_provider=meters).shutdown()  # the shared counts' lock
        os.write(done, b"x")
    finally:
        os._exit(0)


@pytest.fixture
def busy_parent() -> Iterator[tuple[Tracer, GuardSpanProcessor, MeterProvider]]:
    meters = MeterProvider()
    guard = GuardSpanProcessor(
        mode="shadow", meter_provider=meters, logger_provider=LoggerProvider()
    )
    provider = guarded_tracer_provider(guard)
    tracer = provider.get_tracer("agent")
    stop = threading.Event()

    def produce(n: int) -> None:
        i = 0
        while not stop.is_set():
            i += 1
            failing_loop(tracer, f"parent-{n}-{i % 50}", 2, calls=2)

    threads = [threading.Thread(target=produce, args=(n,), daemon=True) for n in range(THREADS)]
    for thread in threads:
        thread.start()
    try:
        yield tracer, guard, meters
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        provider.shutdown()


def test_forked_children_end_spans_while_parent_threads_do(
    busy_parent: tuple[Tracer, GuardSpanProcessor, MeterProvider],
) -> None:
    tracer, guard, meters = busy_parent
    pipes: dict[int, int] = {}  # read end -> child pid
    for _ in range(CHILDREN):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            _child(tracer, guard, meters, write)
        os.close(write)
        pipes[read] = pid
    finished: set[int] = set()
    deadline = time.monotonic() + DEADLINE_SECONDS
    waiting = dict(pipes)
    while waiting:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        ready, _, _ = select.select(list(waiting), [], [], remaining)
        for read in ready:
            if os.read(read, 1) == b"x":
                finished.add(waiting[read])
            del waiting[read]
    hung = [pid for pid in pipes.values() if pid not in finished]
    for pid in hung:
        os.kill(pid, signal.SIGKILL)
    for read, pid in pipes.items():
        os.waitpid(pid, 0)
        os.close(read)
    assert hung == [], f"{len(hung)} of {CHILDREN} children hung"
