"""The Go Collector connector beside the Python replay, on one file, in one run.

    python benchmarks/connector.py              # the replay benchmark's 200k-span tool-heavy file
    python benchmarks/connector.py --spans 50000

Writes the tool-heavy OTLP/JSON file of ``benchmarks/replay_jobs.py``, replays it with
``otel-guard replay --format json`` (a fresh process, start-up included; wall and CPU time), and
runs the connector's Go benchmarks on the same file (``BenchmarkConnectorSpans``: decoded OTLP
through the traces->metrics connector to its last export; ``BenchmarkMemoryPerPrompt``: heap per
tracked prompt, beside the Python guard's figure of ``benchmarks/run.py``). The runs alternate
so a busy machine slows them alike; medians are reported.
The two decision counts must be equal: the run fails otherwise.
"""

from __future__ import annotations

import argparse
import json
import re
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
from run import measure_memory

MODULE = Path(__file__).resolve().parents[1] / "collector" / "repeatedtoolfailureguardconnector"


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _replay(path: Path) -> tuple[float, float, dict[str, Any]]:
    cpu = _children_cpu()
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "otel_guard", "replay", "--format", "json", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    elapsed = time.perf_counter() - start
    report: dict[str, Any] = json.loads(done.stdout)
    return elapsed, _children_cpu() - cpu, report


def _go_bench(path: Path, out: Path) -> tuple[float, float, float, dict[str, Any]]:
    done = subprocess.run(
        ["go", "test", "-run", "^$", "-bench", ".", "-benchtime", "1x", "."],
        cwd=MODULE,
        capture_output=True,
        text=True,
        check=True,
        env={
            **__import__("os").environ,
            "GUARD_BENCH_FILE": str(path),
            "GUARD_BENCH_OUT": str(out),
        },
    )
    line = re.search(r"BenchmarkConnectorSpans.*", done.stdout)
    wall_rate = re.search(r"([\d.]+) spans/s\b", line.group(0) if line else "")
    cpu_rate = re.search(r"([\d.]+) spans/cpu-s", line.group(0) if line else "")
    memory = re.search(
        r"BenchmarkMemoryPerPrompt\S*\s+\d+\s+\d+ ns/op\s+([\d.]+) bytes/prompt", done.stdout
    )
    if wall_rate is None or cpu_rate is None or memory is None:
        raise RuntimeError(f"no benchmark figures in: {done.stdout[-500:]}")
    counts: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return float(wall_rate.group(1)), float(cpu_rate.group(1)), float(memory.group(1)), counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spans", type=int, default=200_000, help="spans in the file")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "spans.jsonl"
        with path.open("w", encoding="utf-8") as out:
            written = workload.write_otlp_json(out, workload.TOOL_HEAVY, args.spans)
        size = path.stat().st_size / 2**20
        print(f"connector vs replay: {written:,} spans ({size:.0f} MiB OTLP/JSON), tool-heavy")
        replays: list[tuple[float, float]] = []
        rates: list[float] = []
        cpu_rates: list[float] = []
        memories: list[float] = []
        report: dict[str, Any] = {}
        counts: dict[str, Any] = {}
        for _ in range(args.repeats):
            wall, cpu, report = _replay(path)
            replays.append((wall, cpu))
            rate, cpu_rate, memory, counts = _go_bench(path, Path(directory) / "go.json")
            rates.append(rate)
            cpu_rates.append(cpu_rate)
            memories.append(memory)
    python = {k: v for k, v in report["decisions"].items() if v}
    if python != counts["decisions"] or counts["spans"] != report["spans"]:
        print(f"decision counts differ: replay {python}, connector {counts['decisions']}")
        return 1
    wall = statistics.median(r[0] for r in replays)
    cpu = statistics.median(r[1] for r in replays)
    rate = statistics.median(rates)
    cpu_rate = statistics.median(cpu_rates)
    print(
        f"  python replay:  {written / wall:9,.0f} spans/s wall, {written / cpu:9,.0f} per CPU s"
        f" ({wall:.2f} s, {cpu:.2f} s CPU; JSON decoding and start-up included)"
    )
    print(
        f"  go connector:   {rate:9,.0f} spans/s wall, {cpu_rate:9,.0f} per CPU s"
        " (decoded OTLP in, as a receiver hands it over)"
    )
    wall_ratio, cpu_ratio = rate / (written / wall), cpu_rate / (written / cpu)
    print(f"  ratio:          {wall_ratio:.1f}x wall, {cpu_ratio:.1f}x CPU")
    python_memory = measure_memory(10_000).bytes_per_prompt
    print(
        f"  memory:         go {statistics.median(memories):.0f} B, python {python_memory:.0f} B"
        " per tracked prompt (state tracking a key; python with its prompt span open)"
    )
    print(f"  decisions equal: {python}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
