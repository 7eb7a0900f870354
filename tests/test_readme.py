"""Every Python example in the README runs as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_readme_python_example_runs(code: str, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        exec(compile(code, str(README), "exec"), {"__name__": "readme_example"})
    except ModuleNotFoundError as exc:  # an optional extra that is not installed
        pytest.skip(f"README example needs the optional module {exc.name!r}")


def test_registering_example_reminds_then_stops(capsys: pytest.CaptureFixture[str]) -> None:
    exec(compile(BLOCKS[0], str(README), "exec"), {"__name__": "readme_example"})
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["turn 1", "turn 2"]
    assert "add to the next model request" in lines[0]
    assert "stop the automatic continuation" in lines[1]
