"""A real SDK pipeline around the guard, and a tiny span producer for tests."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from opentelemetry.sdk._logs import LoggerProvider, ReadableLogRecord
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Span, Tracer, set_span_in_context

from otel_guard import GuardSpanProcessor
from otel_guard.guard.dispatch import guarded_tracer_provider
from otel_guard.guard.telemetry import DECISIONS_METRIC, DIAGNOSTICS_METRIC

RESOURCE = Resource.create({"service.name": "agent", "service.version": "9.9.9"})


def vector_generator(name: str) -> ModuleType:
    """A generator script of ``tests/vectors/`` (``name`` without ``.py``), loaded as a module:
    the folder is not a package, and its scripts also run on their own."""
    path = Path(__file__).resolve().parent / "vectors" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_isolated(script: str, *args: str) -> dict[str, Any]:
    """Run ``script`` in a Python process of its own, from the tests' directory (so it imports
    the test modules and this checkout's package), and return the JSON object on its last line
    of output. For what patches a process for good: an instrumentation, a global provider."""
    tests = Path(__file__).resolve().parent
    path = [str(tests.parent), str(tests), *filter(None, [os.environ.get("PYTHONPATH")])]
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=tests,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(path)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@dataclass(frozen=True)
class Call:
    """One tool call of a batch: its terminal and execution outcome."""

    tool: str | None = "run_shell"
    status: str | None = "error"
    execution: str | None = "error"
    error_type: str | None = "exit_nonzero"
    call_id: str | None = None
    tool_type: str | None = "native"
    duplicate: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict)


FAIL = Call()
OK = Call(status="success", execution="success", error_type=None)


class Harness:
    """TracerProvider + guard + in-memory metric reader and log exporter."""

    def __init__(self, *, fused: bool = False, **guard_kwargs: Any) -> None:
        self.metric_reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(resource=RESOURCE, metric_readers=[self.metric_reader])
        self.log_exporter = InMemoryLogRecordExporter()
        self.logger_provider = LoggerProvider(resource=RESOURCE)
        self.logger_provider.add_log_record_processor(SimpleLogRecordProcessor(self.log_exporter))
        guard_kwargs.setdefault("mode", "shadow")
        self.guard = GuardSpanProcessor(
            meter_provider=self.meter_provider,
            logger_provider=self.logger_provider,
            **guard_kwargs,
        )
        self.span_exporter = InMemorySpanExporter()
        # fused: the guard's not-mine test in the provider's dispatch (otel_guard.guard.dispatch)
        self.tracer_provider = guarded_tracer_provider(self.guard, resource=RESOURCE, fused=fused)
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.span_exporter))
        self.tracer: Tracer = self.tracer_provider.get_tracer("agent")
        self._call_seq = 0

    # -- producing spans ---------------------------------------------------------------------

    def start_prompt(
        self, prompt_id: str, route: str | None = None, channel: bool | None = None
    ) -> Span:
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent",
            "acp.prompt.id": prompt_id,
        }
        if route is not None:
            attributes["acp.prompt.route"] = route
        if channel is not None:
            attributes["acp.prompt.channel"] = channel
        return self.tracer.start_span("invoke_agent", attributes=attributes)

    def batch(
        self,
        prompt_id: str,
        calls: Sequence[Call],
        *,
        parent: Span | None = None,
        admitted: Any = None,
        external: Any = False,
        queued: Any = False,
        reliable: Any = True,
        batch_attributes: Mapping[str, Any] | None = None,
        end_attributes: Mapping[str, Any] | None = None,
        leave_open: int = 0,
    ) -> list[Span]:
        """Emit one batch span with its tool-call children; returns spans left open (late).

        ``batch_attributes`` are set at the batch span's start, ``end_attributes`` just before
        it ends."""
        context = set_span_in_context(parent) if parent is not None else None
        start_attributes: dict[str, Any] = {"acp.prompt.id": prompt_id}
        start_attributes.update(batch_attributes or {})
        batch_span = self.tracer.start_span(
            "tool_batch", context=context, attributes=start_attributes
        )
        batch_context = set_span_in_context(batch_span)
        open_spans = [self.tool_span(call, batch_context) for call in calls]
        late = open_spans[len(open_spans) - leave_open :] if leave_open else []
        for span in open_spans[: len(open_spans) - leave_open]:
            span.end()
        unique = {
            s.attributes.get("gen_ai.tool.call.id")
            for s, c in zip(open_spans, calls, strict=True)
            if not c.duplicate
        }  # type: ignore[union-attr]
        batch_span.set_attribute(
            "acp.batch.admitted", len(unique) if admitted is None else admitted
        )
        for key, value in (
            ("acp.input.external", external),
            ("acp.input.queued_prompt", queued),
            ("acp.input.reliable", reliable),
        ):
            if value is not None:
                batch_span.set_attribute(key, value)
        if end_attributes:
            batch_span.set_attributes(dict(end_attributes))
        batch_span.end()
        return late

    def tool_span(self, call: Call, batch_context: Any) -> Span:
        self._call_seq += 1
        attributes: dict[str, Any] = {"gen_ai.operation.name": "execute_tool"}
        values = {
            "gen_ai.tool.name": call.tool,
            "gen_ai.tool.call.id": call.call_id or f"call-{self._call_seq}",
            "acp.tool.type": call.tool_type,
            "acp.tool.status": call.status,
            "acp.tool.execution.status": call.execution,
            "acp.tool.execution.error_type": call.error_type,
        }
        attributes.update({k: v for k, v in values.items() if v is not None})
        if call.duplicate:
            attributes["acp.tool.provider_duplicate"] = True
        attributes.update(call.extra)
        return self.tracer.start_span("execute_tool", context=batch_context, attributes=attributes)

    def failing_batches(self, prompt_id: str, count: int, size: int = 4, **kw: Any) -> None:
        for _ in range(count):
            self.batch(prompt_id, [FAIL] * size, **kw)

    # -- reading telemetry -------------------------------------------------------------------

    def points(self, name: str = DECISIONS_METRIC) -> list[tuple[dict[str, Any], int]]:
        self.guard.force_flush()
        return metric_points(self.metric_reader, name)

    def decision_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for attributes, value in self.points(DECISIONS_METRIC):
            key = str(attributes["decision"])
            counts[key] = counts.get(key, 0) + value
        return counts

    def diagnostic_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for attributes, value in self.points(DIAGNOSTICS_METRIC):
            key = str(attributes["diagnostic"])
            counts[key] = counts.get(key, 0) + value
        return counts

    def logs(self, event_name: str | None = None) -> list[ReadableLogRecord]:
        self.guard.force_flush()  # the guard emits its records off the agent's thread
        records = list(self.log_exporter.get_finished_logs())
        if event_name is None:
            return records
        return [r for r in records if r.log_record.event_name == event_name]


def metric_points(reader: InMemoryMetricReader, name: str) -> list[tuple[dict[str, Any], int]]:
    """Each data point of the metric ``name`` collected now: its attributes and its value (the
    guard's metrics are all integer counters)."""
    data = reader.get_metrics_data()
    if data is None:
        return []
    return [
        (dict(point.attributes or {}), int(point.value))  # type: ignore[union-attr]
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
        if metric.name == name
        for point in metric.data.data_points
    ]


def decisions_of(records: Iterable[ReadableLogRecord]) -> list[str]:
    return [str((r.log_record.attributes or {})["decision"]) for r in records]


def failing_loop(tracer: Tracer, prompt_id: str, batches: int, calls: int) -> None:
    """One acp prompt whose complete batches all fail the same way: transitions, hence telemetry."""
    prompt = tracer.start_span(
        "invoke_agent",
        attributes={"gen_ai.operation.name": "invoke_agent", "acp.prompt.id": prompt_id},
    )
    for _ in range(batches):
        batch = tracer.start_span(
            "tool_batch",
            context=set_span_in_context(prompt),
            attributes={"acp.prompt.id": prompt_id},
        )
        context = set_span_in_context(batch)
        for n in range(calls):
            tracer.start_span(
                "execute_tool",
                context=context,
                attributes={
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": "run_shell",
                    "gen_ai.tool.call.id": f"c{n}",
                    "acp.tool.type": "native",
                    "acp.tool.status": "error",
                    "acp.tool.execution.status": "error",
                    "acp.tool.execution.error_type": "exit_nonzero",
                },
            ).end()
        batch.set_attributes(
            {
                "acp.batch.admitted": calls,
                "acp.input.external": False,
                "acp.input.queued_prompt": False,
                "acp.input.reliable": True,
            }
        )
        batch.end()
    prompt.end()
