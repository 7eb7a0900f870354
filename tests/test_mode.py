"""Mode resolution: an explicit value, else the process environment, never a dotenv file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_guard import GuardSpanProcessor
from otel_guard.guard.mode import DEFAULT_MODE, MODE_ENV_VAR, ModeResolution, resolve_mode
from otel_guard.guard.telemetry import DIAGNOSTIC_EVENT
from otel_guard.reducer import Mode

SHADOW = ModeResolution("shadow", invalid=False)
SHADOW_INVALID = ModeResolution("shadow", invalid=True)


def test_variable_name_and_default_are_the_contract_values() -> None:
    assert MODE_ENV_VAR == "QWEN_CODE_ACP_REPEATED_TOOL_FAILURE_GUARD"
    assert DEFAULT_MODE == "shadow"


@pytest.mark.parametrize("mode", ["off", "shadow", "warn", "enforce"])
def test_explicit_mode_wins_over_the_environment(mode: Mode) -> None:
    other = "off" if mode == "enforce" else "enforce"
    assert resolve_mode(mode, {MODE_ENV_VAR: other}) == ModeResolution(mode, invalid=False)


def test_explicit_invalid_mode_gives_shadow_flagged_invalid_over_the_environment() -> None:
    assert resolve_mode("enforcing", {MODE_ENV_VAR: "enforce"}) == SHADOW_INVALID


@pytest.mark.parametrize("mode", ["off", "shadow", "warn", "enforce"])
def test_environment_mapping_gives_the_mode(mode: Mode) -> None:
    assert resolve_mode(environ={MODE_ENV_VAR: mode}) == ModeResolution(mode, invalid=False)


def test_given_mapping_is_read_instead_of_the_process_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(MODE_ENV_VAR, "enforce")
    assert resolve_mode(environ={}) == SHADOW
    assert resolve_mode(environ={MODE_ENV_VAR: "warn"}) == ModeResolution("warn", invalid=False)


def test_process_environment_is_read_when_no_mapping_is_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(MODE_ENV_VAR, "warn")
    assert resolve_mode() == ModeResolution("warn", invalid=False)


def test_missing_variable_gives_shadow_without_the_invalid_flag(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(MODE_ENV_VAR, raising=False)
    assert resolve_mode() == SHADOW
    assert resolve_mode(environ={}) == SHADOW
    assert resolve_mode(None, {}) == SHADOW


def test_empty_value_gives_shadow_without_the_invalid_flag() -> None:
    assert resolve_mode(environ={MODE_ENV_VAR: ""}) == SHADOW
    assert resolve_mode("", {}) == SHADOW


@pytest.mark.parametrize("blank", [" ", "   ", "\t\n"])
def test_whitespace_only_value_is_non_empty_and_invalid(blank: str) -> None:
    assert resolve_mode(environ={MODE_ENV_VAR: blank}) == SHADOW_INVALID
    assert resolve_mode(blank, {}) == SHADOW_INVALID


@pytest.mark.parametrize("wrong", [123, 1.5, b"enforce", ["enforce"], True])
def test_explicit_value_of_another_type_is_invalid_and_never_raises(wrong: object) -> None:
    assert resolve_mode(wrong, {MODE_ENV_VAR: "enforce"}) == SHADOW_INVALID


@pytest.mark.parametrize(
    ("explicit", "environment"), [(None, "   "), ("  ", None), (123, None), (None, "bogus")]
)
def test_the_processor_records_one_invalid_mode_diagnostic(
    explicit: object, environment: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if environment is None:
        monkeypatch.delenv(MODE_ENV_VAR, raising=False)
    else:
        monkeypatch.setenv(MODE_ENV_VAR, environment)
    logs = InMemoryLogRecordExporter()
    logger_provider = LoggerProvider()
    logger_provider.add_log_record_processor(SimpleLogRecordProcessor(logs))
    reader = InMemoryMetricReader()
    guard = GuardSpanProcessor(
        mode=explicit,  # type: ignore[arg-type]  # a host's untyped configuration
        meter_provider=MeterProvider(metric_readers=[reader]),
        logger_provider=logger_provider,
    )
    guard.force_flush()
    assert guard.mode == "shadow"
    assert [
        dict(r.log_record.attributes or {})
        for r in logs.get_finished_logs()
        if r.log_record.event_name == DIAGNOSTIC_EVENT
    ] == [{"diagnostic": "invalid_mode"}]
    guard.shutdown()


@pytest.mark.parametrize("invalid", ["enforcing", "true", "1", "en force", "warn,enforce", "ón"])
def test_invalid_value_gives_shadow_with_the_invalid_flag(invalid: str) -> None:
    assert resolve_mode(environ={MODE_ENV_VAR: invalid}) == SHADOW_INVALID


@pytest.mark.parametrize(
    ("raw", "mode"),
    [
        ("ENFORCE", "enforce"),
        ("  Warn  ", "warn"),
        ("\tOff\n", "off"),
        ("sHaDoW", "shadow"),
    ],
)
def test_case_and_surrounding_whitespace_are_ignored(raw: str, mode: Mode) -> None:
    expected = ModeResolution(mode, invalid=False)
    assert resolve_mode(environ={MODE_ENV_VAR: raw}) == expected
    assert resolve_mode(raw) == expected


def test_only_the_exact_variable_name_is_read() -> None:
    environ = {
        MODE_ENV_VAR.lower(): "enforce",
        MODE_ENV_VAR + "_MODE": "enforce",
        "OTEL_GUARD_MODE": "enforce",
    }
    assert resolve_mode(environ=environ) == SHADOW


def test_invalid_flag_does_not_keep_the_raw_value() -> None:
    resolution = resolve_mode(environ={MODE_ENV_VAR: "secret-token-value"})
    assert resolution == SHADOW_INVALID
    assert "secret-token-value" not in repr(resolution)


def test_dotenv_file_in_the_working_directory_is_never_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    workspace = tmp_path / "workspace"
    nested = workspace / "src"
    nested.mkdir(parents=True)
    for directory in (workspace, nested):
        for name in (".env", ".env.local"):
            (directory / name).write_text(f"{MODE_ENV_VAR}=enforce\n", encoding="utf-8")
    monkeypatch.delenv(MODE_ENV_VAR, raising=False)

    for directory in (workspace, nested):
        monkeypatch.chdir(directory)
        assert resolve_mode() == SHADOW
        assert MODE_ENV_VAR not in os.environ
