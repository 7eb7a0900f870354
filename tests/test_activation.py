"""Activation: install_guard in a process whose SDK is set up or not, and the zero-code start.

Global providers can be set once per process, so every case runs in its own Python process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_guard import RedactingSpanExporter, install_guard

CANARY = "canary-7f3a-arguments"

# An agent traced by GenAI conventions through the global tracer: three failing turns.
AGENT = textwrap.dedent(
    f"""
    import json, sys
    from opentelemetry import trace
    from opentelemetry.trace import Status, StatusCode

    def run_agent():
        tracer = trace.get_tracer("agent")
        with tracer.start_as_current_span(
            "invoke_agent", attributes={{"gen_ai.operation.name": "invoke_agent"}}
        ):
            for turn in range(3):
                with tracer.start_as_current_span(
                    "chat", attributes={{"gen_ai.operation.name": "chat"}}
                ):
                    pass
                for call in range(4):
                    with tracer.start_as_current_span(
                        "execute_tool run_shell",
                        attributes={{
                            "gen_ai.operation.name": "execute_tool",
                            "gen_ai.tool.name": "run_shell",
                            "gen_ai.tool.call.id": f"c{{turn}}-{{call}}",
                            "gen_ai.tool.call.arguments": "{CANARY}",
                            "error.type": "exit_nonzero",
                        }},
                    ) as span:
                        span.set_status(Status(StatusCode.ERROR, "{CANARY}"))
            with tracer.start_as_current_span(
                "chat", attributes={{"gen_ai.operation.name": "chat"}}
            ):
                pass

    def summary(installation, **more):
        from otel_guard.guard.processor import GuardSpanProcessor
        provider = trace.get_tracer_provider()
        active = getattr(provider, "_active_span_processor", None)
        processors = getattr(active, "_span_processors", ())
        guards = [p for p in processors if isinstance(p, GuardSpanProcessor)]
        print("SUMMARY " + json.dumps({{
            "installed": installation is not None,
            "guards": len(guards),
            "mode": guards[0].mode if guards else None,
            "joined": sorted(installation.joined) if installation else None,
            "global_is_installation": installation is not None
                and provider is installation.tracer_provider,
            "own_span_path": installation is not None
                and installation.span_exporter is not None,
            **more,
        }}), flush=True)
    """
)

QUIET_EXPORTS = {
    "OTEL_METRIC_EXPORT_INTERVAL": "600000",
    "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
    "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS": "openai_agents",
}


def _run(
    script: str, env: dict[str, str], tmp_path: Path, instrument: bool = False
) -> tuple[str, str, dict[str, Any]]:
    path = tmp_path / "agent.py"
    path.write_text(AGENT + textwrap.dedent(script), encoding="utf-8")
    full_env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("OTEL_") and k != "QWEN_CODE_ACP_REPEATED_TOOL_FAILURE_GUARD"
    }
    full_env.update(QUIET_EXPORTS)
    full_env.update(env)
    command = [sys.executable, str(path)]
    if instrument:
        command = [str(Path(sys.executable).parent / "opentelemetry-instrument"), *command]
    done = subprocess.run(
        command, env=full_env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("SUMMARY ")]
    assert len(lines) == 1, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout, done.stderr, json.loads(lines[0][len("SUMMARY ") :])


def _run_exporting(
    script: str, env: dict[str, str], tmp_path: Path
) -> tuple[str, str, dict[str, Any], dict[str, list[bytes]]]:
    """Run ``script`` under opentelemetry-instrument, exporting OTLP to a receiver on 127.0.0.1;
    also returns the request bodies the receiver kept, by path."""
    from test_wire import Receiver

    receiver = Receiver()
    receiver.start()
    try:
        stdout, stderr, summary = _run(
            script,
            {**env, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint},
            tmp_path,
            instrument=True,
        )
    finally:
        receiver.stop()
    return stdout, stderr, summary, receiver.bodies


def _would_warn_exported(stdout: str) -> bool:
    return "acp.repeated_tool_failure_guard.decisions" in stdout and '"would_warn"' in stdout


def test_a_fresh_process_honours_the_exporter_variables(tmp_path: Path) -> None:
    stdout, stderr, summary = _run(
        """
        from otel_guard import install_guard
        installation = install_guard()
        run_agent()
        readers = installation.meter_provider._metric_readers
        logs = installation.logger_provider._multi_log_record_processor._log_record_processors
        summary(installation, readers=len(readers), log_processors=len(logs))
        installation.shutdown()
        """,
        {
            "OTEL_TRACES_EXPORTER": "console",
            "OTEL_METRICS_EXPORTER": "none",
            "OTEL_LOGS_EXPORTER": "none",
        },
        tmp_path,
    )
    assert summary["installed"] and summary["guards"] == 1 and summary["joined"] == []
    assert summary["global_is_installation"] and summary["own_span_path"]
    assert (summary["readers"], summary["log_processors"]) == (0, 0)
    assert '"execute_tool' in stdout  # spans went to the console, redacted
    assert CANARY not in stdout + stderr
    assert "Failed to export" not in stderr  # nothing tried OTLP


def test_extra_span_processors_and_metric_readers_are_used(tmp_path: Path) -> None:
    _, _, summary = _run(
        """
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        from otel_guard import install_guard
        reader, spans = InMemoryMetricReader(), InMemorySpanExporter()
        installation = install_guard(
            span_processors=[SimpleSpanProcessor(spans)], metric_readers=[reader]
        )
        run_agent()
        names = [m.name for rm in reader.get_metrics_data().resource_metrics
                 for sm in rm.scope_metrics for m in sm.metrics]
        summary(installation, spans=len(spans.get_finished_spans()), metrics=names)
        installation.shutdown()
        """,
        {"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none"},
        tmp_path,
    )
    assert summary["spans"] == 1 + 4 * 3 + 4
    assert "acp.repeated_tool_failure_guard.decisions" in summary["metrics"]
    assert not summary["own_span_path"]


def test_install_guard_joins_global_sdk_providers_already_set(tmp_path: Path) -> None:
    _, stderr, summary = _run(
        """
        from opentelemetry import _logs, metrics, trace
        from opentelemetry.sdk._logs import LoggerProvider
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        from otel_guard import install_guard
        # The host's own setup, as a distro would do it.
        reader, spans = InMemoryMetricReader(), InMemorySpanExporter()
        host = TracerProvider()
        host.add_span_processor(SimpleSpanProcessor(spans))
        trace.set_tracer_provider(host)
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        _logs.set_logger_provider(LoggerProvider())
        installation = install_guard(metric_readers=[InMemoryMetricReader()])
        run_agent()
        decisions = [
            dict(p.attributes)["decision"]
            for rm in reader.get_metrics_data().resource_metrics
            for sm in rm.scope_metrics for m in sm.metrics
            if m.name == "acp.repeated_tool_failure_guard.decisions"
            for p in m.data.data_points
        ]
        summary(installation, decisions=sorted(decisions), host=provider_is_host(host),
                exported=len(spans.get_finished_spans()))
        installation.shutdown()
        """.replace("provider_is_host(host)", "trace.get_tracer_provider() is host"),
        {},
        tmp_path,
    )
    assert summary["joined"] == ["logs", "metrics", "traces"]
    assert summary["host"] and summary["guards"] == 1
    assert summary["decisions"] == ["tracked", "would_stop", "would_warn"]
    assert summary["exported"] == 1 + 4 * 3 + 4  # once, by the host's own path
    assert not summary["own_span_path"]
    assert "takes no new metric readers" in stderr
    assert "existing span export is not redacted" in stderr
    assert "Overriding of current" not in stderr


def test_no_op_global_providers_are_replaced(tmp_path: Path) -> None:
    _, stderr, summary = _run(
        """
        from opentelemetry import _logs, metrics, trace
        from otel_guard import install_guard
        trace.set_tracer_provider(trace.NoOpTracerProvider())
        metrics.set_meter_provider(metrics.NoOpMeterProvider())
        _logs.set_logger_provider(_logs.NoOpLoggerProvider())
        installation = install_guard()
        summary(installation, meters=metrics.get_meter_provider() is installation.meter_provider,
                loggers=_logs.get_logger_provider() is installation.logger_provider)
        installation.shutdown()
        """,
        {"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none"},
        tmp_path,
    )
    assert summary["global_is_installation"] and summary["guards"] == 1
    assert summary["meters"] and summary["loggers"] and summary["joined"] == []
    assert "otel_guard" not in stderr


def test_another_non_sdk_global_provider_is_reported_not_silently_kept(tmp_path: Path) -> None:
    _, stderr, summary = _run(
        """
        from opentelemetry import trace
        from otel_guard import install_guard
        class Vendor(trace.TracerProvider):
            def get_tracer(self, *args, **kwargs):
                return trace.NoOpTracer()
        trace.set_tracer_provider(Vendor())
        installation = install_guard()
        summary(installation)
        installation.shutdown()
        """,
        {"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none"},
        tmp_path,
    )
    assert "cannot be replaced" in stderr and "Vendor" in stderr
    assert summary["installed"] and not summary["global_is_installation"]


# -- zero-code start under the real opentelemetry-instrument ---------------------------------

ZERO_CODE = """
from otel_guard.activation.zero_code import installation
run_agent()
summary(installation())
"""


def _instrument_available() -> None:
    pytest.importorskip(
        "opentelemetry.instrumentation.auto_instrumentation",
        reason="the zero-code start needs the 'instrument' extra installed",
    )
    if not (Path(sys.executable).parent / "opentelemetry-instrument").exists():
        pytest.skip("opentelemetry-instrument is not installed beside this Python")


@pytest.mark.parametrize("variable", ["OTEL_PYTHON_DISTRO", "OTEL_PYTHON_CONFIGURATOR"])
def test_opentelemetry_instrument_starts_the_guard_in_shadow_with_redacted_spans(
    tmp_path: Path, variable: str
) -> None:
    _instrument_available()
    stdout, stderr, summary = _run(
        ZERO_CODE,
        {
            variable: "otel_guard",
            "OTEL_TRACES_EXPORTER": "console",
            "OTEL_METRICS_EXPORTER": "console",
            "OTEL_LOGS_EXPORTER": "console",
        },
        tmp_path,
        instrument=True,
    )
    assert summary["installed"] and summary["guards"] == 1 and summary["mode"] == "shadow"
    assert summary["global_is_installation"] and summary["own_span_path"]
    assert _would_warn_exported(stdout)  # the console metric exporter, at exit
    assert '"execute_tool' in stdout
    assert CANARY not in stdout + stderr
    assert "Overriding of current" not in stderr


def test_opentelemetry_instrument_takes_the_mode_from_the_environment(tmp_path: Path) -> None:
    _instrument_available()
    _, _, summary = _run(
        ZERO_CODE,
        {
            "OTEL_PYTHON_DISTRO": "otel_guard",
            "QWEN_CODE_ACP_REPEATED_TOOL_FAILURE_GUARD": "enforce",
            "OTEL_TRACES_EXPORTER": "none",
            "OTEL_METRICS_EXPORTER": "none",
            "OTEL_LOGS_EXPORTER": "none",
        },
        tmp_path,
        instrument=True,
    )
    assert summary["mode"] == "enforce"


def test_install_guard_joins_what_the_standard_distro_configured(tmp_path: Path) -> None:
    _instrument_available()
    pytest.importorskip("opentelemetry.distro", reason="needs the 'instrument' extra")
    stdout, stderr, summary = _run(
        """
        from otel_guard import install_guard
        installation = install_guard()
        run_agent()
        summary(installation)
        """,
        {
            "OTEL_PYTHON_DISTRO": "distro",
            "OTEL_PYTHON_CONFIGURATOR": "configurator",
            "OTEL_TRACES_EXPORTER": "console",
            "OTEL_METRICS_EXPORTER": "console",
            "OTEL_LOGS_EXPORTER": "console",
        },
        tmp_path,
        instrument=True,
    )
    assert summary["joined"] == ["logs", "metrics", "traces"]
    assert summary["guards"] == 1 and not summary["own_span_path"]
    assert _would_warn_exported(stdout)
    assert "existing span export is not redacted" in stderr


def test_the_configurator_loaded_unnamed_configures_the_sdk_without_the_guard(
    tmp_path: Path,
) -> None:
    _instrument_available()
    stdout, _, summary = _run(
        """
        from otel_guard.activation.zero_code import GuardConfigurator, installation
        GuardConfigurator().configure()
        run_agent()
        summary(installation(), sdk=type(trace.get_tracer_provider()).__name__)
        """,
        {"OTEL_TRACES_EXPORTER": "console"},
        tmp_path,
    )
    assert not summary["installed"] and summary["guards"] == 0
    assert summary["sdk"] == "TracerProvider"
    assert '"execute_tool' in stdout  # the SDK's own console export


# -- a leftover configurator, OTEL_SDK_DISABLED ------------------------------------------------

RAW_AND_ZERO_CODE = """
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from otel_guard.activation.zero_code import installation
raw = InMemorySpanExporter()  # the spans as made, to prove the canary was in them
provider = trace.get_tracer_provider()
if hasattr(provider, "add_span_processor"):
    provider.add_span_processor(SimpleSpanProcessor(raw))
run_agent()
placed = encode_spans(raw.get_finished_spans()).SerializeToString()
summary(
    installation(),
    canary_placed=CANARY.encode() in placed if raw.get_finished_spans() else None,
    provider=type(provider).__name__,
)
"""


def test_a_leftover_configurator_never_exports_raw_spans_under_the_guards_name(
    tmp_path: Path,
) -> None:
    _instrument_available()
    pytest.importorskip("opentelemetry.distro", reason="needs the 'instrument' extra")
    _, stderr, summary, bodies = _run_exporting(
        f"CANARY = {CANARY!r}\n" + RAW_AND_ZERO_CODE,
        {
            "OTEL_PYTHON_DISTRO": "otel_guard",
            "OTEL_PYTHON_CONFIGURATOR": "configurator",  # the SDK's, left over
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_METRICS_EXPORTER": "none",
            "OTEL_LOGS_EXPORTER": "none",
        },
        tmp_path,
    )
    assert summary["canary_placed"] is True
    assert summary["installed"] and summary["guards"] == 1 and summary["own_span_path"]
    assert "overrides OTEL_PYTHON_CONFIGURATOR='configurator'" in stderr
    received = b"".join(bodies["/v1/traces"])
    assert b"execute_tool" in received  # spans did arrive
    assert CANARY.encode() not in received


def test_the_zero_code_start_honours_otel_sdk_disabled(tmp_path: Path) -> None:
    _instrument_available()
    _, _, summary, bodies = _run_exporting(
        f"CANARY = {CANARY!r}\n" + RAW_AND_ZERO_CODE,
        {"OTEL_PYTHON_DISTRO": "otel_guard", "OTEL_SDK_DISABLED": "true"},
        tmp_path,
    )
    assert not summary["installed"] and summary["guards"] == 0
    assert summary["provider"] == "ProxyTracerProvider"  # no SDK provider was built
    assert all(sent == [] for sent in bodies.values())


def test_install_guard_honours_otel_sdk_disabled(tmp_path: Path) -> None:
    _, _, summary = _run(
        """
        from otel_guard import install_guard
        installation = install_guard()
        summary(installation, provider=type(trace.get_tracer_provider()).__name__)
        """,
        {"OTEL_SDK_DISABLED": "TRUE"},
        tmp_path,
    )
    assert not summary["installed"] and summary["guards"] == 0
    assert summary["provider"] == "ProxyTracerProvider"


def test_a_second_install_guard_returns_the_installed_guard(tmp_path: Path) -> None:
    _, stderr, summary = _run(
        """
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from otel_guard import install_guard
        reader = InMemoryMetricReader()
        installation = install_guard(metric_readers=[reader])
        again = install_guard()
        different = install_guard(mode="enforce")
        run_agent()
        decisions = [
            (dict(p.attributes)["decision"], p.value)
            for rm in reader.get_metrics_data().resource_metrics
            for sm in rm.scope_metrics for m in sm.metrics
            if m.name == "acp.repeated_tool_failure_guard.decisions"
            for p in m.data.data_points
        ]
        processors = installation.tracer_provider._active_span_processor._span_processors
        summary(installation, same=again is installation and different is installation,
                decisions=sorted(decisions), processors=len(processors))
        installation.shutdown()
        """,
        {"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none"},
        tmp_path,
    )
    assert summary["same"] and summary["guards"] == 1 and summary["mode"] == "shadow"
    assert summary["joined"] == [] and summary["processors"] == 1
    assert summary["decisions"] == [["tracked", 1], ["would_stop", 1], ["would_warn", 1]]
    assert "not redacted" not in stderr
    assert "already installed on the global providers (mode shadow)" in stderr


def test_a_second_install_guard_on_joined_providers_adds_no_second_guard(
    tmp_path: Path,
) -> None:
    _, _, summary = _run(
        """
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from otel_guard import install_guard
        trace.set_tracer_provider(TracerProvider())
        installation = install_guard()
        again = install_guard()
        run_agent()
        summary(installation, same=again is installation)
        installation.shutdown()
        """,
        {"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none"},
        tmp_path,
    )
    assert summary["same"] and summary["guards"] == 1 and summary["joined"] == ["traces"]


@pytest.fixture
def no_export(monkeypatch: pytest.MonkeyPatch) -> None:
    for signal in ("TRACES", "METRICS", "LOGS"):
        monkeypatch.setenv(f"OTEL_{signal}_EXPORTER", "none")


@pytest.mark.usefixtures("no_export")
def test_none_is_nothing_given_for_the_list_arguments() -> None:
    installation = install_guard(
        set_global=False,
        extra_keys=None,
        extra_patterns=None,
        span_processors=None,
        metric_readers=None,
    )
    assert installation is not None
    assert installation.guard.mode in ("off", "shadow", "warn", "enforce")
    installation.shutdown()


@pytest.mark.usefixtures("no_export")
def test_an_invalid_pattern_raises_naming_the_argument_before_anything_is_built() -> None:
    with pytest.raises(ValueError, match=r"^extra_patterns\[1\] is not a valid regular"):
        install_guard(set_global=False, extra_patterns=["secret_.*", "("])
    with pytest.raises(ValueError, match=r"^extra_patterns\[0\]"):
        RedactingSpanExporter(InMemorySpanExporter(), extra_patterns="(")


@pytest.mark.usefixtures("no_export")
def test_a_pseudonym_key_of_another_type_raises_before_anything_is_built() -> None:
    with pytest.raises(TypeError, match="pseudonym_key"):
        install_guard(set_global=False, pseudonym_key=123)  # type: ignore[arg-type]


def test_unusable_batch_span_settings_are_logged_and_the_sdk_defaults_used(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "-5")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    monkeypatch.setenv("OTEL_LOGS_EXPORTER", "none")
    installation = install_guard(set_global=False)
    assert installation is not None
    assert installation.span_exporter is not None
    assert "OTEL_BSP_* settings are not usable" in caplog.text
    installation.shutdown()


# -- Python logging under the zero-code start ----------------------------------------------------

LOGGING_AGENT = """
import logging
from otel_guard.activation.zero_code import installation
logging.getLogger("agent.steps").warning(
    "calling the tool with %s", CANARY, extra={"user.id": CANARY, "agent.step": "step-seven"}
)
logging.basicConfig(force=True)  # an agent that configures logging after the start
logging.getLogger("agent.steps").warning("after basicConfig", extra={"agent.step": "step-eight"})
run_agent()
summary(installation())
installation().shutdown()
"""


@pytest.mark.parametrize("bridged", [True, False])
def test_the_zero_code_start_bridges_python_logging_redacted_when_asked(
    tmp_path: Path, bridged: bool
) -> None:
    _instrument_available()
    _, stderr, summary, bodies = _run_exporting(
        f"CANARY = {CANARY!r}\n" + LOGGING_AGENT,
        {
            "OTEL_PYTHON_DISTRO": "otel_guard",
            "OTEL_TRACES_EXPORTER": "none",
            "OTEL_METRICS_EXPORTER": "none",
            "OTEL_LOGS_EXPORTER": "otlp",
            "OTEL_PYTHON_LOGGING_AUTO_INSTRUMENTATION_ENABLED": " True " if bridged else "",
            "PYTHONWARNINGS": "always::DeprecationWarning",
        },
        tmp_path,
    )
    assert summary["installed"] and summary["guards"] == 1
    received = b"".join(bodies["/v1/logs"])
    assert b"acp.repeated_tool_failure_guard.transition" in received  # the guard's own records
    # The agent's records, before and after logging.basicConfig(force=True), only when asked.
    assert (b"step-seven" in received) is bridged
    assert (b"step-eight" in received) is bridged
    assert (
        "OTEL_PYTHON_LOGGING_AUTO_INSTRUMENTATION_ENABLED and the SDK's LoggingHandler" in stderr
    ) is bridged
    assert CANARY.encode() not in received  # neither the message's argument nor user.id
