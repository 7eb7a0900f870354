"""The Go connector decides as ``otel-guard replay`` on generated traces of every profile.

Seeded span trees (``tests/span_trees.py``: every profile, attributes set late, outcomes of every
kind, placeholder and long non-ASCII IDs, children that outlive their parents) are run live,
written as OTLP/JSON with the replay's numbers beside them, and handed to the Go test
``TestDecisionCountsEqualReplay`` as its golden directory (``GUARD_GOLDEN_DIR``): the connector
must give the same decision counts, reset reasons and diagnostics for every file. Trees in which
the guard, reading ended spans, has fewer links than the connector (``span_trees.read_whole``)
are left out. It found the differences
fixed with it (contract section 8: the same input gives the same decision counts).

Needs the ``go`` command and the connector's modules in Go's module cache (it never downloads:
``GOPROXY=off``); skipped without them, unless ``OTEL_GUARD_COLLECTOR_REQUIRED`` is set, as
``.ci/run`` sets it after its Go steps.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from harness import vector_generator
from span_trees import Seeded, build, read_whole, run

ROOT = Path(__file__).resolve().parents[1]
CONNECTOR = ROOT / "collector" / "repeatedtoolfailureguardconnector"
TREES = 200  # of each shape


def _unavailable(reason: str) -> None:
    if os.environ.get("OTEL_GUARD_COLLECTOR_REQUIRED"):
        pytest.fail(reason)
    pytest.skip(reason)


def test_the_connector_decides_as_replay_on_generated_traces(tmp_path: Path) -> None:
    go = shutil.which("go")
    if go is None:
        _unavailable("no go command")
    assert go is not None
    replay_numbers = vector_generator("generate_connector_golden").replay_numbers
    files = {}
    for shape in ("any", "loops"):
        for seed in range(TREES):
            nodes = build(Seeded(seed), shape == "loops")
            if not read_whole(nodes):
                continue  # the guard sees fewer links than the connector (documented)
            name = f"{shape}-{seed:03d}.jsonl"
            run(nodes, tmp_path / name)
            files[name] = replay_numbers(tmp_path / name)
    assert len(files) > TREES * 3 // 2
    deciding = [name for name, numbers in files.items() if any(numbers["decisions"].values())]
    warned = [name for name in deciding if files[name]["decisions"]["would_warn"]]
    assert len(deciding) > TREES // 2 and warned  # the trees do reach the reducer
    (tmp_path / "expected.json").write_text(json.dumps({"files": files}), encoding="utf-8")
    env = {
        **os.environ,
        "GUARD_GOLDEN_DIR": str(tmp_path),
        "GOPROXY": "off",
        "GOFLAGS": "-mod=readonly",
    }
    done = subprocess.run(
        [go, "test", "-count=1", "-run", "^TestDecisionCountsEqualReplay$", "."],
        cwd=CONNECTOR,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    output = done.stdout + done.stderr
    if done.returncode != 0 and "GOPROXY=off" in output:
        _unavailable("the connector's Go modules are not in the module cache")
    assert done.returncode == 0, output[-8000:]
