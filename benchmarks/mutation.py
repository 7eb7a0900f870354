"""Mutation testing of the guard's core, one module at a time, within a time budget.

Run from the repository root after ``pip install -e '.[dev,test]'``::

    python benchmarks/mutation.py reducer              # mutate, test, summarise
    python benchmarks/mutation.py processor --budget 900
    python benchmarks/mutation.py reducer --show       # also print each survivor's diff

Each module is mutated in its own scratch copy of the project under ``.mutation/<module>/``
(git-ignored), so that runs of different modules never share results and a rerun only tests
the mutants whose function changed. The run is niced, uses one worker unless told otherwise,
and runs only the test files listed for the module. When the budget runs out the run stops and
the summary counts the unchecked mutants; the next run carries on from there.

The summary's score is ``killed / (checked - equivalent)``. Equivalent mutants (no test can
tell them apart from the original) are listed with their reasons in
``benchmarks/mutation-equivalents.json``; ``docs/mutation-baseline.md`` records the last full
run of each module for comparison. See ``CONTRIBUTING.md``.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRATCH = ROOT / ".mutation"
EQUIVALENTS = ROOT / "benchmarks" / "mutation-equivalents.json"


@dataclass(frozen=True)
class Target:
    """What to mutate, which tests judge it, and how long a full run may take here."""

    sources: tuple[str, ...]
    tests: tuple[str, ...]
    budget_seconds: int


TARGETS: dict[str, Target] = {
    "reducer": Target(
        ("otel_guard/reducer.py",),
        (
            "tests/test_reducer.py",
            "tests/test_reducer_properties.py",
            "tests/test_reducer_what_if.py",
        ),
        600,
    ),
    "processor": Target(
        ("otel_guard/guard/processor.py",),
        (
            "tests/test_processor.py",
            "tests/test_processor_robustness.py",
            "tests/test_batch_assembly.py",
            "tests/test_processor_boundaries.py",
            "tests/test_processor_state_loss.py",
            # Not test_processor_memory.py: it traces every allocation over 5,000 batches, which
            # under the tool takes minutes per mutant; the byte bound it measures is pinned
            # exactly (batch_overflow at the bound) by test_batch_assembly.py and test_processor.py.
            "tests/test_genai_profile.py",
            "tests/test_span_profiles.py",
            "tests/test_dispatch.py",
        ),
        1800,
    ),
    "telemetry": Target(
        ("otel_guard/guard/telemetry.py",),
        (
            "tests/test_telemetry.py",
            "tests/test_telemetry_worker.py",
            "tests/test_processor.py",
            "tests/test_processor_robustness.py",
            "tests/test_cardinality.py",
        ),
        1200,
    ),
    "redaction": Target(
        (
            "otel_guard/privacy/redaction.py",
            "otel_guard/privacy/sensitive.py",
            "otel_guard/privacy/pseudonym.py",
        ),
        (
            "tests/test_redaction.py",
            "tests/test_redaction_edges.py",
            "tests/test_redaction_corpus.py",
            "tests/test_privacy.py",
            "tests/test_pseudonym.py",
        ),
        1200,
    ),
    "readers": Target(
        (
            "otel_guard/replay/otlp_json.py",
            "otel_guard/replay/otlp_proto.py",
            "otel_guard/replay/recorded.py",
            "otel_guard/replay/reader.py",
            "otel_guard/replay/trace_input.py",
        ),
        (
            "tests/test_otlp_json.py",
            "tests/test_otlp_json_errors.py",
            "tests/test_otlp_json_writer.py",
            "tests/test_trace_input.py",
            "tests/test_otlp_proto.py",
            "tests/test_replay_ids.py",
        ),
        3600,
    ),
}

STATEFUL_EXAMPLES = "30"

# Statuses as the tool reports them; "timeout" counts as killed (the mutant hung the tests).
KILLED = {"killed", "timeout", "caught by type check", "segfault"}


def _sync(source: Path, target: Path) -> None:
    """Copy ``source`` over ``target``, leaving unchanged files (and their mtimes) alone."""
    for path in source.rglob("*"):
        if "__pycache__" in path.parts or path.is_dir():
            continue
        destination = target / path.relative_to(source)
        if destination.exists() and filecmp.cmp(path, destination, shallow=False):
            continue
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, destination)


def _toml_list(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(json.dumps(v) for v in values) + "]"


def prepare(name: str, target: Target) -> Path:
    """The module's scratch copy of the project, configured for the mutation tool."""
    work = SCRATCH / name
    work.mkdir(parents=True, exist_ok=True)
    _sync(ROOT / "otel_guard", work / "otel_guard")
    _sync(ROOT / "tests", work / "tests")
    _sync(ROOT / "examples", work / "examples")  # recorded traces some tests replay
    tests = tuple(t for t in target.tests if (ROOT / t).exists())
    config = (ROOT / "pyproject.toml").read_text(encoding="utf-8") + (
        "\n[tool.mutmut]\n"
        'source_paths = ["otel_guard"]\n'
        'also_copy = ["examples"]\n'
        f"only_mutate = {_toml_list(target.sources)}\n"
        f"pytest_add_cli_args_test_selection = {_toml_list(tests)}\n"
        # In the tool's own process: no test workers (pyproject's addopts start them).
        'pytest_add_cli_args = ["-p", "no:cacheprovider", "-n", "0"]\n'
        "use_git_change_detection = false\n"
    )
    pyproject = work / "pyproject.toml"
    if not pyproject.exists() or pyproject.read_text(encoding="utf-8") != config:
        pyproject.write_text(config, encoding="utf-8")
    return work


def run(work: Path, budget: float, jobs: int, mutants: list[str]) -> tuple[float, bool]:
    """Run the tool niced in ``work`` for at most ``budget`` seconds; (seconds, finished)."""
    log = (work / "run.log").open("w", encoding="utf-8")
    command = ["nice", "-n", "10", sys.executable, "-m", "mutmut", "run", "--max-children"]
    started = time.monotonic()
    # The state-machine tests run 1,000 sequences by default and every mutant of the processor
    # reaches them, so a mutation run uses 30: the scenario tests pin each finding, and 30
    # sequences still catch a broken table or state rule.
    environment = {**os.environ, "OTEL_GUARD_STATEFUL_EXAMPLES": STATEFUL_EXAMPLES}
    process = subprocess.Popen(
        [*command, str(jobs), *mutants],
        cwd=work,
        env=environment,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        process.wait(timeout=budget)
        finished = process.returncode == 0
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGINT)  # the tool saves what it has on an interrupt
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        finished = False
    log.close()
    return time.monotonic() - started, finished


def statuses(work: Path) -> dict[str, str]:
    """Every generated mutant of the module, by name, with its status."""
    result = subprocess.run(
        [sys.executable, "-m", "mutmut", "results", "--all", "true"],
        cwd=work,
        capture_output=True,
        text=True,
        check=True,
    )
    found: dict[str, str] = {}
    for line in result.stdout.splitlines():
        name, sep, status = line.strip().rpartition(": ")
        if sep and name.startswith("otel_guard."):
            found[name] = status
    return found


def show(work: Path, mutant: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "mutmut", "show", mutant],
        cwd=work,
        capture_output=True,
        text=True,
        check=False,
    )
    return result.stdout.strip()


def summarise(name: str, found: dict[str, str], equivalent: dict[str, str]) -> list[str]:
    """Print the module's counts and return the survivors not known to be equivalent."""
    counts = Counter("killed" if s in KILLED else s for s in found.values())
    survivors = sorted(m for m, s in found.items() if s == "survived")
    known = [m for m in survivors if m in equivalent]
    unknown = [m for m in survivors if m not in equivalent]
    stale = sorted(m for m in equivalent if found.get(m, "survived") != "survived")
    checked = counts["killed"] + counts["survived"]
    relevant = checked - len(known)
    score = 100.0 * counts["killed"] / relevant if relevant else 100.0
    print(f"module: {name} (mutmut {metadata.version('mutmut')})")
    print(f"  generated:        {len(found)}")
    print(f"  killed:           {counts['killed']}")
    print(f"  survived:         {counts['survived']} ({len(known)} equivalent)")
    print(f"  no tests:         {counts['no tests']}")
    print(f"  not checked:      {counts['not checked']}")
    other = sum(v for k, v in counts.items() if k not in {"killed", "survived", "no tests"})
    other -= counts["not checked"]
    if other:
        print(f"  other:            {other} {dict(counts)}")
    print(f"  score:            {score:.1f}% of {relevant} non-equivalent checked mutants")
    for mutant in unknown:
        print(f"  SURVIVED: {mutant}")
    for mutant in sorted(m for m, s in found.items() if s == "no tests"):
        print(f"  NO TESTS: {mutant}")
    for mutant in stale:
        print(f"  listed as equivalent but {found.get(mutant, 'not generated')}: {mutant}")
    return unknown


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("module", choices=sorted(TARGETS))
    parser.add_argument("--budget", type=float, help="seconds; the module's default otherwise")
    parser.add_argument("--jobs", type=int, default=1, help="parallel workers (default 1)")
    parser.add_argument("--show", action="store_true", help="print each survivor's diff")
    parser.add_argument(
        "--show-equivalent",
        action="store_true",
        help="print the listed equivalent mutants, their diffs and reasons, as a Markdown table",
    )
    parser.add_argument("--mutants", nargs="+", default=[], help="retest only these mutants")
    parser.add_argument("--report-only", action="store_true", help="summarise the last run")
    parser.add_argument("--fresh", action="store_true", help="discard earlier results first")
    args = parser.parse_args(argv)

    target = TARGETS[args.module]
    if args.fresh:
        shutil.rmtree(SCRATCH / args.module, ignore_errors=True)
    work = prepare(args.module, target)
    if not args.report_only:
        budget = args.budget if args.budget is not None else target.budget_seconds
        seconds, finished = run(work, budget, args.jobs, args.mutants)
        state = "finished" if finished else "stopped (budget spent or the tool failed)"
        print(f"run {state} after {seconds:.0f} s; log: {work / 'run.log'}")
    equivalents = (
        json.loads(EQUIVALENTS.read_text(encoding="utf-8")) if EQUIVALENTS.exists() else {}
    )
    equivalent = equivalents.get(args.module, {})
    survivors = summarise(args.module, statuses(work), equivalent)
    if args.show_equivalent:
        print("\n| mutant | change | why it is equivalent |\n|---|---|---|")
        for mutant, reason in sorted(equivalent.items()):
            diff = [
                line
                for line in show(work, mutant).splitlines()
                if line[:1] in "+-" and not line.startswith(("+++", "---"))
            ]
            change = "<br>".join(f"`{line.strip()}`".replace("|", "\\|") for line in diff)
            print(f"| `{mutant.rpartition('.')[2]}` | {change} | {reason} |")
    if args.show:
        for mutant in survivors:
            print(show(work, mutant))
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
