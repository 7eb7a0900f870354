"""The guard's overhead in executed instructions: a figure that machine load cannot move.

CPU-time ratios (``run.py``) move by a tenth between runs on a shared machine; instruction counts
from ``valgrind --tool=callgrind`` are the same in every run. Each arm emits the same generated
sessions through a real ``TracerProvider`` whose other processor discards spans:

* ``without``: no guard;
* ``logic``: the guard with no-op meter and logger providers (its own work only);
* ``full``: the guard with real SDK providers (in-memory metric reader, synchronous in-memory
  log exporter), so every transition's log record is built and exported (by the guard's worker
  thread; callgrind counts every thread, and the records still queued are flushed at the end).

Each arm runs twice, with 0 and with ``--emissions`` emissions after a warm-up, and the
difference is the emissions' cost, so interpreter start-up and imports cancel out.

Usage: ``python benchmarks/instructions.py [--prompts N] [--emissions N] [--profile NAME]``
(needs ``valgrind`` on the PATH; a few minutes per profile).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import workload  # noqa: E402

ARMS = ("without", "logic", "full")
PROFILES = {"tool-heavy": workload.TOOL_HEAVY, "typical": workload.TYPICAL}


def emit_arm(arm: str, profile_name: str, prompts: int, emissions: int) -> None:
    """Run inside valgrind: build ``arm``, warm it up, then emit ``emissions`` times."""
    from opentelemetry._logs import NoOpLoggerProvider
    from opentelemetry.metrics import NoOpMeterProvider
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from run import RESOURCE, DiscardingSpanExporter, Pipeline

    from otel_guard import GuardSpanProcessor

    sessions = workload.generate(PROFILES[profile_name], prompts)
    pipeline: Pipeline | None = None
    if arm == "full":
        pipeline = Pipeline(True)
        provider = pipeline.tracer_provider
    else:
        provider = TracerProvider(resource=RESOURCE)
        if arm == "logic":
            provider.add_span_processor(
                GuardSpanProcessor(
                    mode="shadow",
                    meter_provider=NoOpMeterProvider(),
                    logger_provider=NoOpLoggerProvider(),
                )
            )
        provider.add_span_processor(SimpleSpanProcessor(DiscardingSpanExporter()))
    tracer = provider.get_tracer("agent")
    workload.emit(tracer, sessions, suffix="#warm")
    if pipeline is not None:
        pipeline.flush()  # the warm-up's records: emitted before the counted emissions
    for n in range(emissions):
        workload.emit(tracer, sessions, suffix=f"#{n}")
    # Records are emitted by the guard's worker thread; callgrind counts every thread, and this
    # delivers those still queued, so each arm pays for all of its records.
    if pipeline is not None:
        pipeline.flush()


def _instructions(arm: str, profile: str, prompts: int, emissions: int) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        command = [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={tmp}/callgrind.out",
            sys.executable,
            __file__,
            "--child",
            arm,
            "--profile",
            profile,
            "--prompts",
            str(prompts),
            "--emissions",
            str(emissions),
        ]
        # A fixed hash seed: dictionary and set layouts, and so the counts, repeat exactly.
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        done = subprocess.run(command, capture_output=True, text=True, check=True, env=env)
    found = re.search(r"I\s+refs:\s+([\d,]+)", done.stderr)
    if found is None:
        raise RuntimeError("valgrind printed no instruction count")
    return int(found.group(1).replace(",", ""))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--profile", choices=sorted(PROFILES), action="append")
    parser.add_argument("--prompts", type=int, default=30)
    parser.add_argument("--emissions", type=int, default=3)
    parser.add_argument("--child", choices=ARMS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    profiles = args.profile or ["tool-heavy", "typical"]
    if args.child:
        emit_arm(args.child, profiles[0], args.prompts, args.emissions)
        return 0
    if shutil.which("valgrind") is None:
        print("valgrind is not on the PATH: no instruction counts", file=sys.stderr)
        return 1
    print(f"instructions added by the guard ({args.prompts} prompts x {args.emissions} emissions)")
    for profile in profiles:
        cost = {
            arm: _instructions(arm, profile, args.prompts, args.emissions)
            - _instructions(arm, profile, args.prompts, 0)
            for arm in ARMS
        }
        base = cost["without"]
        print(
            f"  {profile:<10}  without {base:,}  "
            f"logic {cost['logic'] / base:.3f}  full {cost['full'] / base:.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
