"""Replay throughput with one process and with ``--jobs N``, side by side in one run.

    python benchmarks/replay_jobs.py            # the 200k-span tool-heavy file, jobs 1 and 2
    python benchmarks/replay_jobs.py --quick    # 50k spans, one run each
    python benchmarks/replay_jobs.py --jobs 1 2 3 --spans 400000

Each run is ``otel-guard replay --format json FILE`` in a fresh process (start-up included), the
runs of different job counts interleaved so that a busy machine slows them alike; the medians
are reported, with the CPU time of the run and its children. The reports must be identical.

On a shared machine, wall time says more about the neighbours than about the replay. So each
shard of ``--jobs N`` is also run alone, in a fresh process (start-up included), and its CPU
time reported (the smallest of the runs, the least disturbed): with N cores to itself, the
replay takes as long as its slowest shard, and ``one job CPU / slowest shard CPU`` is the
speed-up the cores would give.
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


_SHARD = """
import gc, sys
from otel_guard.cli import _bulk_collection
from otel_guard.replay.shards import replay_shard
with _bulk_collection():
    replay_shard([sys.argv[1]], "shadow", {}, int(sys.argv[2]), int(sys.argv[3]))
"""


def _run_shard(path: Path, index: int, jobs: int) -> float:
    cpu = _children_cpu()
    command = [sys.executable, "-c", _SHARD, str(path), str(index), str(jobs)]
    subprocess.run(command, check=True)
    return _children_cpu() - cpu


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
        shard_cpu: dict[tuple[int, int], list[float]] = {}
        for _ in range(repeats):
            for jobs in args.jobs:
                elapsed, cpu, reports[jobs] = _run(path, jobs)
                times[jobs].append((elapsed, cpu))
                for index in range(jobs if jobs > 1 else 0):
                    shard_cpu.setdefault((jobs, index), []).append(_run_shard(path, index, jobs))
    base = None
    for jobs in args.jobs:
        wall = statistics.median(t[0] for t in times[jobs])
        cpu = statistics.median(t[1] for t in times[jobs])
        rate = written / wall
        base = base or rate
        print(
            f"  --jobs {jobs}: {wall:6.2f} s wall, {cpu:6.2f} s CPU, {rate:9,.0f} spans/s"
            f"  ({rate / base:.2f}x)"
        )
    one_cpu = min(t[1] for t in times[1]) if 1 in times else None
    for jobs in args.jobs:
        if jobs == 1:
            continue
        cpus = [min(shard_cpu[jobs, index]) for index in range(jobs)]
        shown = ", ".join(f"{cpu:.2f}" for cpu in cpus)
        speedup = f" ({one_cpu / max(cpus):.2f}x one job's {one_cpu:.2f} s)" if one_cpu else ""
        print(f"  --jobs {jobs}: each shard alone, CPU s: {shown}{speedup}")
    same = all(report == reports[args.jobs[0]] for report in reports.values())
    print(f"  reports identical: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
