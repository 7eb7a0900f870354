"""A forked child never inherits a lock held by one of its parent's threads.

Pre-fork servers (gunicorn, multiprocessing's ``fork`` start method) fork while other threads
end spans; only the forking thread survives in the child, so any lock another thread held at
that moment stays held forever unless the child re-creates it.

The scenario runs in an interpreter of its own (this file, run as a script), with one provider
of each kind as a host has. In the test process it would fork a process that holds every
provider the earlier tests made (the SDK keeps each one for its shutdown at exit), and since
SDK 1.45 each of them refreshes its resource in every forked child with a thread pool of its
own: with some 1,200 providers a child spent seconds in the SDK's handlers before reaching the
guard, and the test failed on time, not on a lock.
"""

from __future__ import annotations

import faulthandler
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback

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
    except BaseException:  # told to the parent, which fails with it
        os.write(done, traceback.format_exc().encode()[-4096:])
    finally:
        os._exit(0)


def scenario() -> str | None:
    """Fork ``CHILDREN`` children while ``THREADS`` threads of the parent end spans through the
    guard; each child ends spans, flushes and makes a processor. ``None`` when every child
    finished in time, else what went wrong (a hung child's stacks, or a child's exception)."""
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
    pipes: dict[int, int] = {}  # read end -> child pid
    failures: list[str] = []
    # A hung child is asked for its threads' stacks (the handler is inherited by fork) before
    # it is killed, so that a failure says where it hung.
    with tempfile.TemporaryFile("w+") as stacks:
        faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
        try:
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
                    told = os.read(read, 8192)
                    if told:
                        finished.add(waiting[read])
                        if told != b"x":
                            failures.append(told.decode(errors="replace"))
                    del waiting[read]
            hung = [pid for pid in pipes.values() if pid not in finished]
            for pid in hung[:2]:  # one at a time: their stacks would interleave
                os.kill(pid, signal.SIGUSR1)
                time.sleep(0.5)
            for pid in hung:
                os.kill(pid, signal.SIGKILL)
            for read, pid in pipes.items():
                os.waitpid(pid, 0)
                os.close(read)
        finally:
            faulthandler.unregister(signal.SIGUSR1)
            stop.set()
            for thread in threads:
                thread.join()
            provider.shutdown()
        stacks.seek(0)
        where = stacks.read()
    if failures:
        return f"{len(failures)} of {CHILDREN} children raised; the first:\n{failures[0]}"
    if hung:
        # Hung, or ended without a word (a crash): the stacks are those of hung children.
        return f"{len(hung)} of {CHILDREN} children did not finish; stacks:\n{where}"
    return None


def test_forked_children_end_spans_while_parent_threads_do() -> None:
    result = subprocess.run(
        [sys.executable, __file__],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


if __name__ == "__main__":  # the scenario's own interpreter; harness is beside this file
    failure = scenario()
    print(failure or "every child finished")
    sys.exit(1 if failure else 0)
