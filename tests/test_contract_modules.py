"""The module names the contract gives stay importable after the package's regrouping."""

from __future__ import annotations

import importlib

import pytest

import otel_guard


@pytest.mark.parametrize(
    ("contract_name", "home"),
    [
        ("otel_guard.attributes", "otel_guard.spans.attributes"),
        ("otel_guard.telemetry", "otel_guard.guard.telemetry"),
    ],
)
def test_contract_module_names_export_every_public_name_of_their_home(
    contract_name: str, home: str
) -> None:
    contract = importlib.import_module(contract_name)
    source = importlib.import_module(home)
    assert contract.__all__ == source.__all__
    for name in source.__all__:
        assert getattr(contract, name) is getattr(source, name), name


def test_the_contract_attribute_names_are_read_from_otel_guard_attributes() -> None:
    from otel_guard.attributes import BATCH_ADMITTED, PROMPT_ID, TOOL_TYPE

    assert (PROMPT_ID, BATCH_ADMITTED, TOOL_TYPE) == (
        "acp.prompt.id",
        "acp.batch.admitted",
        "acp.tool.type",
    )


def test_the_public_names_import_from_the_package() -> None:
    for name in otel_guard.__all__:
        assert getattr(otel_guard, name) is not None
