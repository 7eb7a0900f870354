"""``collector-config/otelcol.yaml``, unchanged, in the real otelcol-guard distribution.

The configuration validates and runs; spans with canaries sent by the Python SDK over OTLP/HTTP
(in span and event attributes, exceptions, event names, GenAI span names, status messages, span
links and resource attributes) leave it without them for agent services, and another service's
plain spans unchanged, links and all (a second collector
of the distribution stands in for the OTLP/HTTP backend and writes what it receives with the
``file`` exporter); and the guard's counters, sent over OTLP, are scraped from its ``prometheus``
exporter by a real Prometheus on which the repository's rules evaluate.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from canaries import FIXED, CanaryAgent, leaks
from collector_process import (
    Collector,
    collector_binary,
    free_port,
    health_extension,
    json_lines,
    wait_for,
    write_config,
)
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, Status, StatusCode

from otel_guard import GuardSpanProcessor
from otel_guard.replay.otlp_json import encode_request

ROOT = Path(__file__).resolve().parent.parent
OTELCOL = ROOT / "collector-config" / "otelcol.yaml"
AGENT_SERVICE = "canary-agent"
OTHER_SERVICE = "web-shop"
# A web service's ordinary attributes, carrying canaries, that the gateway must pass unchanged.
OTHER_ATTRIBUTES = {
    "error.type": "CnryWebTypeZq Connection reset",
    "url.full": "https://shop.example/CnryWebUrlZq?q=1",
    "db.query.text": "SELECT CnryWebDbZq FROM t",
    "exception.message": "CnryWebExcZq boom",
}


@pytest.fixture(scope="module")
def binary() -> Path:
    return collector_binary()


def otelcol_env(sink_port: int) -> tuple[dict[str, str], dict[str, int]]:
    ports = {name: free_port() for name in ("grpc", "http", "prometheus", "health")}
    env = {
        "OTELCOL_OTLP_GRPC_ENDPOINT": f"127.0.0.1:{ports['grpc']}",
        "OTELCOL_OTLP_HTTP_ENDPOINT": f"127.0.0.1:{ports['http']}",
        "OTELCOL_PROMETHEUS_ENDPOINT": f"127.0.0.1:{ports['prometheus']}",
        "OTELCOL_HEALTH_ENDPOINT": f"127.0.0.1:{ports['health']}",
        "OTELCOL_EXPORT_ENDPOINT": f"http://127.0.0.1:{sink_port}",
        "OTELCOL_AGENT_SERVICES": f"^{AGENT_SERVICE}$",
        "OTEL_GUARD_PSEUDONYM_KEY": "collector-test-key",
    }
    return env, ports


def test_otelcol_yaml_validates_in_the_distribution(binary: Path, tmp_path: Path) -> None:
    env, _ = otelcol_env(free_port())
    result = subprocess.run(
        [str(binary), "validate", f"--config={OTELCOL}"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, **env},
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_validate_refuses_a_statement_that_does_not_parse(binary: Path, tmp_path: Path) -> None:
    # validate really parses OTTL: the test above could not pass on a config it does not read.
    broken = tmp_path / "broken.yaml"
    broken.write_text(
        OTELCOL.read_text(encoding="utf-8").replace(
            'set(status.message, "")', 'set(status.message, ""'
        ),
        encoding="utf-8",
    )
    env, _ = otelcol_env(free_port())
    result = subprocess.run(
        [str(binary), "validate", f"--config={broken}"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, **env},
    )
    assert result.returncode != 0
    assert "transform/genai: statement has invalid syntax" in result.stderr


@dataclass
class Gateway:
    """otelcol.yaml in front of a sink collector that writes what it receives to files."""

    otelcol: Collector
    sink: Collector
    ports: dict[str, int]
    traces: Path
    logs: Path

    @property
    def otlp_http(self) -> str:
        return f"http://127.0.0.1:{self.ports['http']}"

    @property
    def prometheus_target(self) -> str:
        return f"127.0.0.1:{self.ports['prometheus']}"


def sink_config(tmp_path: Path, otlp_port: int, health_port: int) -> Path:
    return write_config(
        tmp_path / "sink.yaml",
        {
            "receivers": {"otlp": {"protocols": {"http": {"endpoint": f"127.0.0.1:{otlp_port}"}}}},
            "exporters": {
                "file/traces": {"path": str(tmp_path / "traces.jsonl"), "flush_interval": "100ms"},
                "file/logs": {"path": str(tmp_path / "logs.jsonl"), "flush_interval": "100ms"},
            },
            "extensions": health_extension(health_port),
            "service": {
                "extensions": ["health_check"],
                "telemetry": {"metrics": {"level": "none"}},
                "pipelines": {
                    "traces": {"receivers": ["otlp"], "exporters": ["file/traces"]},
                    "logs": {"receivers": ["otlp"], "exporters": ["file/logs"]},
                },
            },
        },
    )


@pytest.fixture(scope="module")
def gateway(binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp_path = tmp_path_factory.mktemp("gateway")
    sink_port, sink_health = free_port(), free_port()
    sink = Collector(binary, [sink_config(tmp_path, sink_port, sink_health)], tmp_path, sink_health)
    try:
        env, ports = otelcol_env(sink_port)
        otelcol = Collector(binary, [OTELCOL], tmp_path, ports["health"], env)
        try:
            yield Gateway(otelcol, sink, ports, tmp_path / "traces.jsonl", tmp_path / "logs.jsonl")
        finally:
            otelcol.stop()
    finally:
        sink.stop()


def spans_out(path: Path) -> dict[str, list[dict[str, Any]]]:
    """Spans the sink wrote, by service name."""
    found: dict[str, list[dict[str, Any]]] = {}
    for request in json_lines(path):
        for resource_spans in request.get("resourceSpans", []):
            attributes = {
                a["key"]: a["value"].get("stringValue")
                for a in resource_spans.get("resource", {}).get("attributes", [])
            }
            service = str(attributes.get("service.name"))
            for scope_spans in resource_spans.get("scopeSpans", []):
                found.setdefault(service, []).extend(scope_spans.get("spans", []))
    return found


def test_agent_spans_leave_without_canaries_and_other_services_unchanged(
    gateway: Gateway,
) -> None:
    memory = InMemorySpanExporter()
    exporter = OTLPSpanExporter(endpoint=f"{gateway.otlp_http}/v1/traces")
    agent_provider = TracerProvider(resource=Resource.create({"service.name": AGENT_SERVICE}))
    agent_provider.add_span_processor(GuardSpanProcessor(mode="shadow"))
    agent_provider.add_span_processor(SimpleSpanProcessor(memory))
    agent_provider.add_span_processor(SimpleSpanProcessor(exporter))
    CanaryAgent(agent_provider.get_tracer("agent"), GuardSpanProcessor(mode="shadow"), FIXED).run()

    other_provider = TracerProvider(resource=Resource.create({"service.name": OTHER_SERVICE}))
    other_provider.add_span_processor(SimpleSpanProcessor(memory))
    other_provider.add_span_processor(
        SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{gateway.otlp_http}/v1/traces"))
    )
    with other_provider.get_tracer("web").start_as_current_span(
        "GET /checkout", attributes=OTHER_ATTRIBUTES
    ):
        pass
    agent_provider.shutdown()
    other_provider.shutdown()

    sent = list(memory.get_finished_spans())
    agent_sent = [s for s in sent if s.resource.attributes["service.name"] == AGENT_SERVICE]
    # The canaries are in what the agent sent, so the check below can fail.
    raw = str(encode_request(agent_sent)).encode()
    assert {place for place, _ in leaks({"sent": raw}, FIXED)} == {
        place for place, _ in FIXED.markers()
    }

    wait_for(
        "every span at the sink",
        lambda: sum(len(v) for v in spans_out(gateway.traces).values()) == len(sent),
        gateway.otelcol.log_tail,
    )
    by_service = spans_out(gateway.traces)
    assert len(by_service[AGENT_SERVICE]) == len(agent_sent)
    # Nothing of any canary is left, links included: the links of agent spans are dropped
    # (OTTL reaches no link's attributes), and counted.
    assert leaks({"sink": json.dumps(by_service[AGENT_SERVICE]).encode()}, FIXED) == []
    linked = [s for s in agent_sent if s.links]
    assert linked
    assert all(not s.get("links") for s in by_service[AGENT_SERVICE])
    assert sum(int(s.get("droppedLinksCount", 0)) for s in by_service[AGENT_SERVICE]) == len(linked)
    (other,) = by_service[OTHER_SERVICE]
    assert other["name"] == "GET /checkout"
    assert {a["key"]: a["value"]["stringValue"] for a in other["attributes"]} == OTHER_ATTRIBUTES
    # Agent spans kept what the guard reads: the tool-call structure and pseudonymous names.
    tool_spans = [
        s
        for s in by_service[AGENT_SERVICE]
        if any(a["key"] == "acp.tool.status" for a in s.get("attributes", []))
    ]
    assert tool_spans
    names = {
        a["value"]["stringValue"]
        for s in tool_spans
        for a in s["attributes"]
        if a["key"] == "gen_ai.tool.name"
    }
    assert len(names) == 1 and next(iter(names)).startswith("tool_")


def test_the_guards_counters_pass_otelcol_yaml_to_prometheus_and_the_rules_evaluate(
    gateway: Gateway, tmp_path: Path
) -> None:
    yaml = pytest.importorskip("yaml")
    from test_collector_config import RULES
    from test_prometheus_e2e import (
        PROMETHEUS_BINARY,
        by_labels,
        start_prometheus,
        stop,
    )
    from test_prometheus_e2e import wait_for as wait_for_prometheus

    if PROMETHEUS_BINARY is None:
        pytest.skip("no 'prometheus' binary on PATH (Debian: apt-get install prometheus)")
    from test_collector_config import DECISIONS_SERIES

    resource = Resource.create(
        {
            "service.name": AGENT_SERVICE,
            "service.version": "3.1.4",
            "deployment.environment.name": "collector-e2e",
        }
    )
    memory = InMemoryMetricReader()
    meter_provider = MeterProvider(
        resource=resource,
        metric_readers=[
            memory,
            PeriodicExportingMetricReader(
                OTLPMetricExporter(endpoint=f"{gateway.otlp_http}/v1/metrics"),
                export_interval_millis=500,
            ),
        ],
    )
    tracer_provider = TracerProvider(resource=resource)
    guard = GuardSpanProcessor(mode="shadow", meter_provider=meter_provider)
    tracer_provider.add_span_processor(guard)
    process = None
    try:
        CanaryAgent(tracer_provider.get_tracer("agent"), guard, FIXED).run()
        tracer_provider.force_flush()
        meter_provider.force_flush()
        process, api = start_prometheus(tmp_path, [gateway.prometheus_target])
        expected = {
            ("collector-e2e", "3.1.4", "shadow", decision): float(count)
            for decision, count in {
                "tracked": 3,
                "would_warn": 1,
                "would_stop": 1,
                "reset": 3,
            }.items()
        }
        query = (
            "sum by (deployment_environment_name, service_version, mode, decision) "
            f"({DECISIONS_SERIES})"
        )

        def seen() -> dict[tuple[str, ...], float]:
            return by_labels(
                api.query(query),
                "deployment_environment_name",
                "service_version",
                "mode",
                "decision",
            )

        wait_for_prometheus(
            "the guard's decisions through the collector", lambda: seen() == expected, api
        )
        # Every recording rule and alert of the repository loads and evaluates on them.
        declared_rules = {
            rule.get("record") or rule.get("alert")
            for group in yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]
            for rule in group["rules"]
        }

        def loaded_rules(api: Any) -> set[str]:
            return {
                rule["name"]
                for group in api.get("/api/v1/rules")["data"]["groups"]
                for rule in group["rules"]
            }

        wait_for_prometheus(
            "every rule group to be evaluated",
            lambda: (
                all(
                    group.get("lastEvaluation", "").startswith("20")
                    and all(rule.get("health") == "ok" for rule in group["rules"])
                    for group in api.get("/api/v1/rules")["data"]["groups"]
                )
                and loaded_rules(api) == declared_rules
            ),
            api,
        )
        # The recorded decision rate carries the environment and version from the resource.
        wait_for_prometheus(
            "a recorded decision rate",
            lambda: any(
                s["metric"].get("deployment_environment_name") == "collector-e2e"
                for s in api.query("otel_guard:decisions:rate5m")
            ),
            api,
        )
    finally:
        if process is not None:
            stop(process)
        tracer_provider.shutdown()
        meter_provider.shutdown()


# -- every place of a span: events, links, resource, status ------------------------------------

# One canary per place, each with its own marker, so a leak names where it came from.
PLACES = {
    "resource.command_line": "CnryResCmdZq python agent.py --api-key sk-live-9",
    "resource.command_args": "CnryResArgsZq --api-key",
    "resource.executable": "CnryResExeZq/home/alice/venv/bin/python",
    "resource.owner": "CnryResOwnerZq-alice",
    "resource.content": "CnryResPromptZq You are a helpful assistant",
    "plain.attribute": "CnryPlainAttrZq SELECT secret FROM notes",
    "plain.url": "https://internal.example/CnryPlainUrlZq?token=1",
    "plain.event.attribute": "CnryPlainEventZq stdout of the tool",
    "plain.exception": "CnryPlainExcZq permission denied for token sk-9",
    "plain.link": "CnryPlainLinkZq-alice@example.com",
    "plain.status": "CnryPlainStatusZq: quota exceeded",
    "genai.name": "CnryGenaiNameZq summarise notes",
    "genai.event.name": "CnryGenaiEventNameZq said",
    "genai.event.attribute": "CnryGenaiEventAttrZq the user's notes",
    "genai.exception": "CnryGenaiExcZq rate limited for sk-8",
    "genai.link": "CnryGenaiLinkZq reply to the user",
    "genai.status": "CnryGenaiStatusZq: content filtered",
}


def _marker(value: str) -> str:
    start = value.index("Cnry")
    return value[start : value.index("Zq", start) + 2]


def place_leaks(data: str) -> list[str]:
    return [place for place, value in PLACES.items() if _marker(value) in data]


def _decoded(value: dict[str, Any]) -> Any:
    """An OTLP/JSON AnyValue as the SDK holds it (arrays as tuples)."""
    ((kind, inner),) = value.items()
    if kind == "arrayValue":
        return tuple(_decoded(v) for v in inner.get("values", []))
    if kind == "intValue":
        return int(inner)
    return inner


def _json_attributes(items: list[dict[str, Any]] | None) -> dict[str, Any]:
    return {a["key"]: _decoded(a["value"]) for a in items or []}


def _sdk_attributes(attributes: Any) -> dict[str, Any]:
    return {
        key: tuple(value) if isinstance(value, (list, tuple)) else value
        for key, value in (attributes or {}).items()
    }


def span_view(span: dict[str, Any]) -> dict[str, Any]:
    """What a span says, from the file exporter's JSON: the fields the redaction may touch."""
    status = span.get("status", {})
    return {
        "name": span["name"],
        "attributes": _json_attributes(span.get("attributes")),
        "events": [
            (e.get("name", ""), _json_attributes(e.get("attributes")))
            for e in span.get("events", [])
        ],
        "links": [
            (link["traceId"], link["spanId"], _json_attributes(link.get("attributes")))
            for link in span.get("links", [])
        ],
        "dropped_links": int(span.get("droppedLinksCount", 0)),
        "status": (int(status.get("code", 0)), status.get("message", "")),
    }


def sdk_view(span: Any) -> dict[str, Any]:
    """The same view of a span the SDK ended."""
    return {
        "name": span.name,
        "attributes": _sdk_attributes(span.attributes),
        "events": [(e.name, _sdk_attributes(e.attributes)) for e in span.events],
        "links": [
            (
                f"{link.context.trace_id:032x}",
                f"{link.context.span_id:016x}",
                _sdk_attributes(link.attributes),
            )
            for link in span.links
        ],
        "dropped_links": span.dropped_links,
        "status": (span.status.status_code.value, span.status.description or ""),
    }


def traces_out(path: Path) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(resource attributes, span) for every span the sink wrote."""
    found = []
    for request in json_lines(path):
        for resource_spans in request.get("resourceSpans", []):
            resource = _json_attributes(resource_spans.get("resource", {}).get("attributes"))
            for scope_spans in resource_spans.get("scopeSpans", []):
                found.extend((resource, span) for span in scope_spans.get("spans", []))
    return found


def _failure(message: str) -> ValueError:
    try:
        raise ValueError(message)
    except ValueError as exc:
        return exc


def emit_every_place(tracer: Any) -> None:
    """A GenAI model call and a plain span of the same agent, canaries in every place."""
    with tracer.start_as_current_span("warm-up") as earlier:
        pass
    model = tracer.start_span(
        f"chat {PLACES['genai.name']}",
        attributes={
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": "model-x",
            "gen_ai.usage.input_tokens": 12,
        },
        links=[Link(earlier.get_span_context(), {"gen_ai.prompt": PLACES["genai.link"]})],
    )
    model.add_event(
        PLACES["genai.event.name"],
        {"gen_ai.prompt": PLACES["genai.event.attribute"], "gen_ai.usage.input_tokens": 12},
    )
    model.record_exception(_failure(PLACES["genai.exception"]))
    model.set_status(Status(StatusCode.ERROR, PLACES["genai.status"]))
    model.end()

    plain = tracer.start_span(
        "GET /internal/search",
        attributes={
            "http.request.method": "GET",
            "db.query.text": PLACES["plain.attribute"],
            "url.full": PLACES["plain.url"],
            "retry.count": 2,
        },
        links=[
            Link(
                model.get_span_context(),
                {"user.id": PLACES["plain.link"], "link.reason": "follows"},
            )
        ],
    )
    plain.add_event("tool.ran", {"subprocess.stdout": PLACES["plain.event.attribute"], "code": 1})
    plain.record_exception(_failure(PLACES["plain.exception"]))
    plain.set_status(Status(StatusCode.ERROR, PLACES["plain.status"]))
    plain.end()


AGENT_RESOURCE = {
    "service.name": AGENT_SERVICE,
    "deployment.environment.name": "canary-env",
    "process.command_line": PLACES["resource.command_line"],
    "process.command_args": ("python", "agent.py", PLACES["resource.command_args"]),
    "process.executable.path": PLACES["resource.executable"],
    "process.owner": PLACES["resource.owner"],
    "app.system.prompt": PLACES["resource.content"],
}


def test_events_links_resources_and_status_of_agent_services_leave_without_canaries(
    gateway: Gateway,
) -> None:
    memory = InMemorySpanExporter()
    providers = []
    for resource in (AGENT_RESOURCE, {**AGENT_RESOURCE, "service.name": OTHER_SERVICE}):
        provider = TracerProvider(resource=Resource.create(resource))
        provider.add_span_processor(SimpleSpanProcessor(memory))
        provider.add_span_processor(
            SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{gateway.otlp_http}/v1/traces"))
        )
        emit_every_place(provider.get_tracer("places"))
        providers.append(provider)
    for provider in providers:
        provider.shutdown()
    sent = {f"{s.context.span_id:016x}": s for s in memory.get_finished_spans()}
    # Every canary is in what both services sent (events, links and status included).
    for service in (AGENT_SERVICE, OTHER_SERVICE):
        views = [
            (dict(s.resource.attributes), sdk_view(s))
            for s in sent.values()
            if s.resource.attributes["service.name"] == service
        ]
        assert sorted(place_leaks(repr(views))) == sorted(PLACES), service

    def arrived() -> list[tuple[dict[str, Any], dict[str, Any]]]:
        return [(r, s) for r, s in traces_out(gateway.traces) if s["spanId"] in sent]

    wait_for(
        "every span at the sink", lambda: len(arrived()) == len(sent), gateway.otelcol.log_tail
    )
    agent = [(r, s) for r, s in arrived() if r["service.name"] == AGENT_SERVICE]
    other = [(r, s) for r, s in arrived() if r["service.name"] == OTHER_SERVICE]
    assert len(agent) == len(other) == 3

    # The agent service: no canary anywhere, not even a marker.
    assert place_leaks(json.dumps(agent)) == []
    resource = agent[0][0]
    assert resource["deployment.environment.name"] == "canary-env"
    views = {s["spanId"]: span_view(s) for _, s in agent}
    by_name = {view["name"]: view for view in views.values()}
    model, plain = by_name["chat model-x"], by_name["GET /internal/search"]
    # What carries no content stays: structure, counts, the status code, exception types.
    assert model["attributes"]["gen_ai.usage.input_tokens"] == 12
    assert [name for name, _ in model["events"]] == ["redacted", "exception"]
    assert model["events"][0][1] == {"gen_ai.usage.input_tokens": 12}
    assert model["events"][1][1]["exception.type"] == "ValueError"
    assert plain["attributes"] == {"http.request.method": "GET", "retry.count": 2}
    assert plain["events"][0] == ("tool.ran", {"code": 1})
    assert plain["events"][1][1]["exception.type"] == "ValueError"
    assert model["status"] == plain["status"] == (StatusCode.ERROR.value, "")
    # Span links: their attributes are out of the collector's reach, so an agent service's
    # spans (and every GenAI span) lose their links, and count them as dropped.
    assert model["links"] == plain["links"] == []
    assert model["dropped_links"] == plain["dropped_links"] == 1

    # The other service: its resource and its plain spans exactly as sent, links and all; its
    # GenAI span gets the allow-list, whichever service sent it.
    for resource, span in other:
        original = sent[span["spanId"]]
        assert resource == _sdk_attributes(original.resource.attributes)
        view = span_view(span)
        if view["attributes"].get("gen_ai.operation.name") is None:
            assert view == sdk_view(original)
        else:
            assert place_leaks(json.dumps(span)) == []
    assert {s["name"] for _, s in other} == {"warm-up", "GET /internal/search", "chat model-x"}


def test_free_text_in_section_3_vocabularies_leaves_as_other(gateway: Gateway) -> None:
    # A value outside a closed vocabulary is said to be one, as the agent's own redactor says it.
    provider = TracerProvider(resource=Resource.create({"service.name": AGENT_SERVICE}))
    provider.add_span_processor(
        SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{gateway.otlp_http}/v1/traces"))
    )
    odd = {
        "acp.tool.type": "CnryVocabTypeZq",
        "acp.tool.status": "CnryVocabStatusZq disk full",
        "acp.tool.execution.status": "CnryVocabExecZq",
    }
    attributes = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.call.id": "vocab-1",
        **odd,
    }
    provider.get_tracer("agent").start_span("execute_tool", attributes=attributes).end()
    provider.shutdown()

    def found() -> list[dict[str, Any]]:
        return [
            s
            for s in spans_out(gateway.traces).get(AGENT_SERVICE, [])
            if any(a["value"].get("stringValue") == "vocab-1" for a in s.get("attributes", []))
        ]

    wait_for("the span at the sink", lambda: bool(found()), gateway.otelcol.log_tail)
    (span,) = found()
    assert "CnryVocab" not in json.dumps(span)
    kept = {a["key"]: a["value"].get("stringValue") for a in span["attributes"]}
    assert {key: kept.get(key) for key in odd} == dict.fromkeys(odd, "_OTHER")


def test_merged_tools_and_placeholder_call_ids_leave_as_written(gateway: Gateway) -> None:
    """Google ADK's "(merged tools)" is no call and a placeholder call ID is a missing one, to
    the guard: a pseudonym of either would read as a tool's call, or as one ID shared by all."""
    provider = TracerProvider(resource=Resource.create({"service.name": AGENT_SERVICE}))
    provider.add_span_processor(
        SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{gateway.otlp_http}/v1/traces"))
    )
    tracer = provider.get_tracer("agent")
    for tool, call_id in (("(merged tools)", "<not specified>"), ("CnryMergeToolZq", "")):
        attributes = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": tool,
            "gen_ai.tool.call.id": call_id,
            "error.type": "TimeoutError",
        }
        tracer.start_span("execute_tool", attributes=attributes).end()
    provider.shutdown()

    def found() -> list[dict[str, Any]]:
        return [
            s
            for s in spans_out(gateway.traces).get(AGENT_SERVICE, [])
            if any(a["key"] == "error.type" for a in s.get("attributes", []))
            and any(a["key"] == "gen_ai.tool.call.id" for a in s.get("attributes", []))
            and not any(a["key"] == "acp.tool.status" for a in s.get("attributes", []))
        ]

    wait_for("both spans at the sink", lambda: len(found()) >= 2, gateway.otelcol.log_tail)
    kept = {
        (attributes.get("gen_ai.tool.name"), attributes.get("gen_ai.tool.call.id"))
        for attributes in (
            {a["key"]: a["value"].get("stringValue") for a in span["attributes"]}
            for span in found()
        )
    }
    assert ("(merged tools)", "<not specified>") in kept
    (name,) = {name for name, call_id in kept if call_id == ""}
    assert name is not None and name.startswith("tool_") and "Cnry" not in name
