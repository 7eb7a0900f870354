"""The replay readers' import graph: the JSON and protobuf readers share the recorded-span model
of ``otel_guard.replay.recorded`` and neither imports the other or its private names."""

from __future__ import annotations

import ast
from pathlib import Path

import otel_guard.replay

_PACKAGE = Path(otel_guard.replay.__file__).parent


def _imports(module: str) -> list[tuple[str, str]]:
    """(module, name) of every ``from ... import`` in ``module``, nested imports included."""
    tree = ast.parse((_PACKAGE / f"{module}.py").read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.extend((node.module, alias.name) for alias in node.names)
        elif isinstance(node, ast.Import):
            found.extend((alias.name, "") for alias in node.names)
    return found


def test_the_json_reader_does_not_import_the_protobuf_reader() -> None:
    modules = {module for module, _ in _imports("otlp_json")}
    assert "otel_guard.replay.otlp_proto" not in modules


def test_the_protobuf_reader_does_not_import_the_json_reader() -> None:
    modules = {module for module, _ in _imports("otlp_proto")}
    assert "otel_guard.replay.otlp_json" not in modules


def test_no_replay_module_imports_a_private_name_of_another() -> None:
    for path in _PACKAGE.glob("*.py"):
        for module, name in _imports(path.stem):
            if module.startswith("otel_guard."):
                assert not name.startswith("_"), f"{path.name} imports {module}.{name}"


def test_the_recorded_span_model_imports_no_reader() -> None:
    modules = {module for module, _ in _imports("recorded")}
    assert not {m for m in modules if m.startswith("otel_guard.replay")}
