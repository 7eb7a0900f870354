"""Replay throughput with one process and with ``--jobs N``, side by side in one run.

    python benchmarks/replay_jobs.py            # the 200k-span tool-heavy file, jobs 1 and 2
    python benchmarks/replay_jobs.py --quick    # 50k spans, one run each
    python benchmarks/replay_jobs.py --jobs 1 2 3 --spans 400000

Each run is ``otel-guard replay --format json FILE`` in a fresh process (start-up included), the
runs of different job counts interleaved so that a busy machine slows them alike; the medians
are reported, with the CPU time of the run and its children. The reports must be identical.

On a shared machine, wall time says more about the neighbours than about the replay. So
``--jobs N`` is also run in this process (:func:`otel_guard.replay.shards.replay_ranges`) and
the CPU time of each of its processes reported (each decodes its share of the byte ranges and
replays one shard), with the decoding of all ranges together. With N cores to itself the run
takes at least ``max(all CPU / N, slowest process)``; that bound over one job's CPU is
the wall ratio the cores would give, printed beside the measured one.

Last, the size of the ``replay --html`` page of a 20,000-span file of the same workload.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import workload


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run(path: Path, jobs: int) -> tuple[float, float, dict[str, Any]]:
    command = [sys.executable, "-m", "otel_guard", "replay", "--format", "json"]
    command += ["--jobs", str(jobs), str(path)]
    cpu = _children_cpu()
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"replay --jobs {jobs} failed: {done.stderr.strip()[:300]}")
    report = json.loads(done.stdout)
    report.pop("files", None)
    return elapsed, _children_cpu() - cpu, report


_RANGES = """
import json, sys, time
from otel_guard.cli import _bulk_collection
from otel_guard.replay.shards import plan, replay_ranges
with _bulk_collection():
    began = time.process_time()
    pieces = plan([sys.argv[1]])
    ranged = replay_ranges(pieces, "shadow", {}, int(sys.argv[2]))
    main = time.process_time() - began
print(json.dumps([main, ranged.decoding_cpu, list(ranged.process_cpu), ranged.sent]))
"""


def _run_ranges(path: Path, jobs: int) -> tuple[float, float, list[float], int]:
    """CPU seconds of the main process, of the decoding (all processes), of each process; spans
    sent from one process to another."""
    command = [sys.executable, "-c", _RANGES, str(path), str(jobs)]
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    main, decoding, processes, sent = json.loads(done.stdout)
    return main, decoding, processes, sent


def _page_size(directory: str) -> int:
    path = Path(directory) / "page.jsonl"
    with path.open("w", encoding="utf-8") as out:
        workload.write_otlp_json(out, workload.TOOL_HEAVY, 20_000)
    page = Path(directory) / "page.html"
    command = [sys.executable, "-m", "otel_guard", "replay", "--html", str(page), str(path)]
    subprocess.run(command, check=True, capture_output=True)
    return page.stat().st_size


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="50k spans, one run per job count")
    parser.add_argument("--spans", type=int, default=200_000, help="spans in the file")
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, 2], help="job counts")
    parser.add_argument("--repeats", type=int, default=3, help="runs per job count")
    args = parser.parse_args()
    spans, repeats = (50_000, 1) if args.quick else (args.spans, args.repeats)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "spans.jsonl"
        with path.open("w", encoding="utf-8") as out:
            written = workload.write_otlp_json(out, workload.TOOL_HEAVY, spans)
        size = path.stat().st_size / 2**20
        print(f"replay --jobs: {written:,} spans ({size:.0f} MiB OTLP/JSON), {cores} cores")
        times: dict[int, list[tuple[float, float]]] = {jobs: [] for jobs in args.jobs}
        reports: dict[int, dict[str, Any]] = {}
        parts: dict[int, list[tuple[float, float, list[float], int]]] = {}
        for _ in range(repeats):
            for jobs in args.jobs:
                elapsed, cpu, reports[jobs] = _run(path, jobs)
                times[jobs].append((elapsed, cpu))
                if jobs > 1:
                    parts.setdefault(jobs, []).append(_run_ranges(path, jobs))
        page = _page_size(directory)
    base = None
    for jobs in args.jobs:
        wall = statistics.median(t[0] for t in times[jobs])
        cpu = statistics.median(t[1] for t in times[jobs])
        base = base or wall
        print(
            f"  --jobs {jobs}: {wall:6.2f} s wall ({wall / base:.2f} of the first), {cpu:6.2f} s"
            f" CPU, {written / cpu:9,.0f} spans/s of CPU"
        )
    one_cpu = min(t[1] for t in times[1]) if 1 in times else None
    for jobs, runs in parts.items():
        # The least disturbed run: the smallest total CPU.
        main, decoding, processes, sent = min(runs, key=lambda r: r[0] + sum(r[2]))
        total = main + sum(processes)
        bound = max(total / jobs, max(processes))
        shown = ", ".join(f"{cpu:.2f}" for cpu in processes)
        ratio = f", {bound / one_cpu:.2f} of one job's {one_cpu:.2f} s CPU" if one_cpu else ""
        print(
            f"  --jobs {jobs} in parts, CPU s: main {main:.2f}, processes {shown} (decoding"
            f" {decoding:.2f} of it); spans sent {sent:,}; with {jobs} free cores at least"
            f" {bound:.2f} s{ratio}"
        )
    print(f"  replay --html page of 20,000 spans: {page / 1e6:.3f} MB")
    same = all(report == reports[args.jobs[0]] for report in reports.values())
    print(f"  reports identical: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
