"""The guard connector in the otelcol-guard distribution: the same decisions as ``replay``.

Equivalence: OTLP/JSON trace files (the repository's demo traces, and traces generated with the
SDK for the GenAI and OpenInference profiles) go line by line to a collector's OTLP/HTTP
receiver (``application/json``: the same JSON the ``otlpjsonfile`` receiver reads), through the
guard connector, and out through the ``file`` exporter as metrics and logs. Their decision
counts per environment and version equal ``otel-guard replay``'s on the same files.

Scale-out: a load-balancing collector routes by agent process (``service.instance.id``) to two
guard collectors; each process, every span of it, reaches one of them, their decisions add up to
one guard's on the same input, and every prompt is decided by one of them. Routed by trace ID
instead, the same input splits prompts whose batches are separate traces.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from collector_process import (
    Collector,
    free_port,
    guard_binary,
    health_extension,
    json_lines,
    post,
    wait_for,
    write_config,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import Span, Status, StatusCode, Tracer, set_span_in_context

from otel_guard.replay.otlp_json import OtlpJsonSpanExporter

ROOT = Path(__file__).resolve().parent.parent
DEMO_TRACES = ROOT / "examples" / "demo-traces.jsonl"
DECISIONS_METRIC = "acp.repeated_tool_failure_guard.decisions"
TRANSITION_EVENT = "acp.repeated_tool_failure_guard.transition"
ENVIRONMENT = "deployment.environment.name"
VERSION = "service.version"
# Short enough for a test, long enough that every span of a trace sent in one go is awaited.
GUARD_CONFIG = {"wait": "500ms", "prompt_ttl": "10m"}

Group = tuple[str, str, str]  # environment, version, decision


@pytest.fixture(scope="module")
def binary() -> Path:
    return guard_binary()


# -- traces of each profile, generated with the SDK -------------------------------------------


def _processes(path: Path, count: int) -> Iterator[tuple[int, Tracer]]:
    """``count`` agent processes (two environments, two versions) writing OTLP/JSON to ``path``."""
    with path.open("a", encoding="utf-8") as stream:
        for index in range(count):
            provider = TracerProvider(
                resource=Resource.create(
                    {
                        "service.name": "generated-agent",
                        "service.instance.id": f"instance-{path.stem}-{index}",
                        ENVIRONMENT: ("prod", "staging")[index % 2],
                        VERSION: ("1.0.0", "1.1.0")[(index // 2) % 2],
                    }
                )
            )
            provider.add_span_processor(SimpleSpanProcessor(OtlpJsonSpanExporter(stream)))
            yield index, provider.get_tracer("generated")
            provider.shutdown()


def _fail(span: Span, error_type: str | None) -> None:
    span.set_status(Status(StatusCode.ERROR))
    if error_type is not None:
        span.set_attribute("error.type", error_type)


def _prompt_rounds(index: int) -> list[list[str | None]]:
    """Each round: one model call, then its tool calls' outcomes (None: success, else a type)."""
    rng = random.Random(index)
    loop = [["exit_nonzero"] * 4] * rng.choice((2, 3, 4))
    recovered = [["timeout"] * 2, [None]]
    free_text = [["Connection reset by peer"]]
    return rng.choice((loop, loop, recovered, free_text))


def genai_traces(path: Path, processes: int = 16) -> Path:
    """Agents traced with the GenAI conventions only (section 3b): no acp.* attribute."""
    for index, tracer in _processes(path, processes):
        for prompt_number in range(2):
            prompt = tracer.start_span(
                "invoke_agent coder",
                attributes={
                    "gen_ai.operation.name": "invoke_agent",
                    "gen_ai.conversation.id": f"conv-{index}-{prompt_number}",
                },
            )
            context = set_span_in_context(prompt)
            calls = 0
            for outcomes in [*_prompt_rounds(index + prompt_number), []]:
                model = tracer.start_span(
                    "chat m", context=context, attributes={"gen_ai.operation.name": "chat"}
                )
                model.end()
                for outcome in outcomes:
                    calls += 1
                    tool = tracer.start_span(
                        "execute_tool run_shell",
                        context=context,
                        attributes={
                            "gen_ai.operation.name": "execute_tool",
                            "gen_ai.tool.name": "run_shell",
                            "gen_ai.tool.call.id": f"call-{calls}",
                        },
                    )
                    if outcome is not None:
                        _fail(tool, outcome)
                    tool.end()
            prompt.end()
    return path


def openinference_traces(path: Path, processes: int = 16) -> Path:
    """Agents traced with OpenInference (section 3c): AGENT, LLM and TOOL span kinds."""
    for index, tracer in _processes(path, processes):
        for prompt_number in range(2):
            session = f"session-{index}-{prompt_number}"
            prompt = tracer.start_span(
                "agent", attributes={"openinference.span.kind": "AGENT", "session.id": session}
            )
            context = set_span_in_context(prompt)
            calls = 0
            for outcomes in [*_prompt_rounds(index + 7 * prompt_number), []]:
                llm = tracer.start_span(
                    "llm",
                    context=context,
                    attributes={"openinference.span.kind": "LLM", "session.id": session},
                )
                llm.end()
                for outcome in outcomes:
                    calls += 1
                    tool = tracer.start_span(
                        "run_shell",
                        context=context,
                        attributes={
                            "openinference.span.kind": "TOOL",
                            "tool.name": "run_shell",
                            "tool_call.id": f"call-{calls}",
                            "session.id": session,
                        },
                    )
                    if outcome is not None:
                        _fail(tool, outcome)
                    tool.end()
            prompt.end()
    return path


# -- both sides' counts -----------------------------------------------------------------------


def replay_counts(*files: Path) -> tuple[Counter[Group], dict[str, Any]]:
    result = subprocess.run(
        [sys.executable, "-m", "otel_guard", "replay", "--format", "json", *map(str, files)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    report: dict[str, Any] = json.loads(result.stdout)
    counts: Counter[Group] = Counter()
    for group in report["groups"]:
        for decision, count in group["decisions"].items():
            if count:
                counts[(group[ENVIRONMENT], group[VERSION], decision)] += count
    return counts, report


def _attributes(items: list[dict[str, Any]] | None) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for item in items or []:
        value = item.get("value", {})
        values[item["key"]] = next(iter(value.values()), None) if value else None
    return values


def transitions(path: Path) -> list[tuple[str, str, dict[str, Any]]]:
    """(environment, version, attributes) of every transition log record the guard wrote."""
    found = []
    for request in json_lines(path):
        for resource_logs in request.get("resourceLogs", []):
            resource = _attributes(resource_logs.get("resource", {}).get("attributes"))
            for scope_logs in resource_logs.get("scopeLogs", []):
                for record in scope_logs.get("logRecords", []):
                    attributes = _attributes(record.get("attributes"))
                    name = record.get("eventName") or attributes.get("event.name")
                    if name == TRANSITION_EVENT:
                        found.append(
                            (str(resource.get(ENVIRONMENT)), str(resource.get(VERSION)), attributes)
                        )
    return found


def log_counts(path: Path) -> Counter[Group]:
    return Counter((env, version, str(a["decision"])) for env, version, a in transitions(path))


def metric_counts(path: Path) -> Counter[Group]:
    """Decision counts from the decisions counter: the latest point of each cumulative series."""
    latest: dict[tuple[Any, ...], tuple[int, int]] = {}
    series_group: dict[tuple[Any, ...], Group] = {}
    deltas: Counter[Group] = Counter()
    for request in json_lines(path):
        for resource_metrics in request.get("resourceMetrics", []):
            resource = _attributes(resource_metrics.get("resource", {}).get("attributes"))
            for scope_metrics in resource_metrics.get("scopeMetrics", []):
                for metric in scope_metrics.get("metrics", []):
                    if metric.get("name") != DECISIONS_METRIC:
                        continue
                    data = metric["sum"]
                    for point in data.get("dataPoints", []):
                        attributes = _attributes(point.get("attributes"))
                        group = (
                            str(resource.get(ENVIRONMENT)),
                            str(resource.get(VERSION)),
                            str(attributes["decision"]),
                        )
                        value = int(point.get("asInt", 0))
                        if data.get("aggregationTemporality") in (
                            1,
                            "AGGREGATION_TEMPORALITY_DELTA",
                        ):
                            deltas[group] += value
                            continue
                        key = (
                            tuple(sorted(resource.items())),
                            tuple(sorted(attributes.items())),
                        )
                        stamp = int(point.get("timeUnixNano", 0))
                        if key not in latest or latest[key][0] <= stamp:
                            latest[key] = (stamp, value)
                        series_group[key] = group
    counts = Counter(deltas)
    for key, (_, value) in latest.items():
        counts[series_group[key]] += value
    return +counts


# -- collectors --------------------------------------------------------------------------------


def guard_config(
    workdir: Path, name: str, http_port: int, grpc_port: int, health: int, keep_spans: bool
) -> Path:
    """A guard collector's configuration; with ``keep_spans`` it also writes the spans it got."""
    traces_exporters = ["repeated_tool_failure_guard"] + (["file/traces"] if keep_spans else [])
    return write_config(
        workdir / f"{name}.yaml",
        {
            "receivers": {
                "otlp": {
                    "protocols": {
                        "http": {"endpoint": f"127.0.0.1:{http_port}"},
                        "grpc": {"endpoint": f"127.0.0.1:{grpc_port}"},
                    }
                }
            },
            "connectors": {"repeated_tool_failure_guard": GUARD_CONFIG},
            "exporters": {
                "file/metrics": {
                    "path": str(workdir / f"{name}-metrics.jsonl"),
                    "flush_interval": "100ms",
                },
                "file/logs": {
                    "path": str(workdir / f"{name}-logs.jsonl"),
                    "flush_interval": "100ms",
                },
                "file/traces": {
                    "path": str(workdir / f"{name}-traces.jsonl"),
                    "flush_interval": "100ms",
                },
            },
            "extensions": health_extension(health),
            "service": {
                "extensions": ["health_check"],
                "telemetry": {"metrics": {"level": "none"}},
                "pipelines": {
                    "traces": {"receivers": ["otlp"], "exporters": traces_exporters},
                    "metrics": {
                        "receivers": ["repeated_tool_failure_guard"],
                        "exporters": ["file/metrics"],
                    },
                    "logs": {
                        "receivers": ["repeated_tool_failure_guard"],
                        "exporters": ["file/logs"],
                    },
                },
            },
        },
    )


class Guard:
    """A guard collector: OTLP in, decisions out to files."""

    def __init__(self, binary: Path, workdir: Path, name: str, keep_spans: bool = False) -> None:
        self.http_port, self.grpc_port, health = free_port(), free_port(), free_port()
        config = guard_config(workdir, name, self.http_port, self.grpc_port, health, keep_spans)
        self.metrics = workdir / f"{name}-metrics.jsonl"
        self.logs = workdir / f"{name}-logs.jsonl"
        self.traces = workdir / f"{name}-traces.jsonl"
        self.collector = Collector(binary, [config], workdir, health)

    def send(self, *files: Path) -> None:
        send_lines(f"http://127.0.0.1:{self.http_port}/v1/traces", *files)


def send_lines(url: str, *files: Path) -> None:
    for file in files:
        for line in file.read_bytes().splitlines():
            if line.strip():
                assert post(url, line, "application/json") == 200


def settled(read: Any, want: Counter[Group]) -> Any:
    """A check that holds once ``read()`` gives ``want`` (the guard decides after its wait)."""
    return lambda: read() == want


def assert_equivalent(binary: Path, workdir: Path, *files: Path) -> None:
    want, report = replay_counts(*files)
    assert want, f"replay found no decisions in {files}: {report.get('error')}"
    guard = Guard(binary, workdir, "guard")
    try:
        guard.send(*files)
        wait_for(
            "the guard's transition logs to match replay",
            settled(lambda: log_counts(guard.logs), want),
            lambda: (
                f"replay: {sorted(want.items())}\nguard: {sorted(log_counts(guard.logs).items())}"
                f"\n{guard.collector.log_tail()}"
            ),
        )
        wait_for(
            "the guard's decision counter to match replay",
            settled(lambda: metric_counts(guard.metrics), want),
            lambda: (
                f"replay: {sorted(want.items())}\n"
                f"guard: {sorted(metric_counts(guard.metrics).items())}"
            ),
        )
    finally:
        guard.collector.stop()
    # Stopping flushes nothing new: the counts were final.
    assert log_counts(guard.logs) == want
    modes = {a["mode"] for _, _, a in transitions(guard.logs)}
    assert modes == {"shadow"}


def test_demo_traces_give_replays_decisions_per_environment_and_version(
    binary: Path, tmp_path: Path
) -> None:
    assert_equivalent(binary, tmp_path, DEMO_TRACES)


def test_genai_profile_traces_give_replays_decisions(binary: Path, tmp_path: Path) -> None:
    assert_equivalent(binary, tmp_path, genai_traces(tmp_path / "genai.jsonl"))


def test_openinference_traces_give_replays_decisions(binary: Path, tmp_path: Path) -> None:
    traces = openinference_traces(tmp_path / "openinference.jsonl")
    _, report = replay_counts(traces)
    if "openinference" not in report["profiles"]:
        pytest.skip("this otel-guard replay has no OpenInference profile (contract section 3c)")
    assert report["profiles"]["openinference"] > 0
    assert_equivalent(binary, tmp_path, traces)


# -- scale-out ---------------------------------------------------------------------------------


# The balancer of collector-config/README.md: by agent process. The loadbalancing exporter
# (v0.161.0) routes traces by `traceID`, `service` or `attributes`; `attributes` reads the
# resource first, so every span of a process, whichever trace it is in, goes to one guard.
BY_PROCESS = {"routing_key": "attributes", "routing_attributes": ["service.instance.id"]}
BY_TRACE = {"routing_key": "traceID"}
INSTANCE = "service.instance.id"


def balancer_config(
    workdir: Path, http_port: int, health: int, backends: list[str], routing: dict[str, Any]
) -> Path:
    return write_config(
        workdir / "balancer.yaml",
        {
            "receivers": {"otlp": {"protocols": {"http": {"endpoint": f"127.0.0.1:{http_port}"}}}},
            "exporters": {
                "load_balancing": {
                    **routing,
                    "protocol": {"otlp": {"tls": {"insecure": True}}},
                    "resolver": {"static": {"hostnames": backends}},
                }
            },
            "extensions": health_extension(health),
            "service": {
                "extensions": ["health_check"],
                "telemetry": {"metrics": {"level": "none"}},
                "pipelines": {"traces": {"receivers": ["otlp"], "exporters": ["load_balancing"]}},
            },
        },
    )


def prompts_by_guard(*guards: Guard) -> list[set[tuple[str, str, str]]]:
    return [
        {(env, version, str(a["prompt_id"])) for env, version, a in transitions(g.logs)}
        for g in guards
    ]


def spans_by_instance(*files: Path) -> Counter[str]:
    """Spans per ``service.instance.id`` in OTLP/JSON trace files."""
    counts: Counter[str] = Counter()
    for file in files:
        for request in json_lines(file):
            for resource_spans in request.get("resourceSpans", []):
                resource = _attributes(resource_spans.get("resource", {}).get("attributes"))
                for scope_spans in resource_spans.get("scopeSpans", []):
                    counts[str(resource.get(INSTANCE))] += len(scope_spans.get("spans", []))
    return counts


def scale_out_input(tmp_path: Path) -> list[Path]:
    """Every profile's traces, with agents whose prompts span several traces (a batch each)."""
    (tmp_path / "batches").mkdir()
    files = [
        genai_traces(tmp_path / "genai.jsonl"),
        DEMO_TRACES,
        acp_batches(tmp_path / "batches" / "acp.jsonl", range(4), processes=8),
    ]
    openinference = openinference_traces(tmp_path / "openinference.jsonl")
    if "openinference" in replay_counts(openinference)[1]["profiles"]:
        files.append(openinference)
    return files


class Tier:
    """A load-balancing collector in front of two guard collectors that keep what they got."""

    def __init__(self, binary: Path, workdir: Path, routing: dict[str, Any]) -> None:
        workdir.mkdir()
        self.guards: list[Guard] = []
        self.balancer: Collector | None = None
        try:
            for name in ("guard-a", "guard-b"):
                self.guards.append(Guard(binary, workdir, name, keep_spans=True))
            self.http, health = free_port(), free_port()
            backends = [f"127.0.0.1:{g.grpc_port}" for g in self.guards]
            config = balancer_config(workdir, self.http, health, backends, routing)
            self.balancer = Collector(binary, [config], workdir, health)
        except BaseException:
            self.stop()
            raise

    def send(self, *files: Path) -> None:
        send_lines(f"http://127.0.0.1:{self.http}/v1/traces", *files)

    def decisions(self) -> Counter[Group]:
        return log_counts(self.guards[0].logs) + log_counts(self.guards[1].logs)

    def stop(self) -> None:
        for collector in [self.balancer, *(g.collector for g in self.guards)]:
            if collector is not None:
                collector.stop()


def test_two_guards_behind_a_load_balancer_decide_as_one(binary: Path, tmp_path: Path) -> None:
    files = scale_out_input(tmp_path)
    want, _ = replay_counts(*files)
    sent = spans_by_instance(*files)
    single_dir = tmp_path / "single"
    single_dir.mkdir()
    single = Guard(binary, single_dir, "single")
    try:
        single.send(*files)
        tier = Tier(binary, tmp_path / "tier", BY_PROCESS)
        try:
            tier.send(*files)
            wait_for("the single guard to decide", settled(lambda: log_counts(single.logs), want))
            wait_for(
                "the two guards' decisions to add up to one guard's",
                settled(tier.decisions, want),
                lambda: f"one: {sorted(want.items())}\ntwo: {sorted(tier.decisions().items())}",
            )
            # Routed by what the README says: each agent process, every span of it, at one guard.
            received = [spans_by_instance(g.traces) for g in tier.guards]
            assert received[0] + received[1] == sent
            assert received[0] and received[1], "the balancer sent every process to one guard"
            assert not set(received[0]) & set(received[1]), "a process went to both guards"
            a, b = prompts_by_guard(*tier.guards)
            assert a and b
            assert not a & b, f"prompts decided by both guards: {sorted(a & b)}"
            assert a | b == prompts_by_guard(single)[0]
            wait_for(
                "the two guards' counters to add up",
                lambda: sum((metric_counts(g.metrics) for g in tier.guards), Counter()) == want,
            )
        finally:
            tier.stop()
    finally:
        single.collector.stop()


def test_routing_by_trace_id_instead_would_split_prompts(binary: Path, tmp_path: Path) -> None:
    # The control: the same input routed by trace ID sends the batches of one prompt (separate
    # traces of one process) to both guards, which the test above would catch.
    files = scale_out_input(tmp_path)
    tier = Tier(binary, tmp_path / "tier", BY_TRACE)
    try:
        tier.send(*files)
        wait_for(
            "a prompt decided by both guards",
            lambda: bool(set.intersection(*prompts_by_guard(*tier.guards))),
            lambda: str(prompts_by_guard(*tier.guards)),
        )
        received = [spans_by_instance(g.traces) for g in tier.guards]
        assert set(received[0]) & set(received[1])
    finally:
        tier.stop()


# -- a guard collector that restarts -----------------------------------------------------------


def acp_batches(path: Path, rounds: range, processes: int = 4) -> Path:
    """Agents with acp.* spans, each batch its own trace: rounds of four failing calls."""
    for index, tracer in _processes(path, processes):
        for round_number in rounds:
            batch = tracer.start_span("tool_batch", attributes={"acp.prompt.id": f"p-{index}"})
            context = set_span_in_context(batch)
            for call in range(4):
                tracer.start_span(
                    "execute_tool",
                    context=context,
                    attributes={
                        "gen_ai.operation.name": "execute_tool",
                        "gen_ai.tool.name": "run_shell",
                        "gen_ai.tool.call.id": f"call-{round_number}-{call}",
                        "acp.tool.type": "native",
                        "acp.tool.status": "error",
                        "acp.tool.execution.status": "error",
                        "acp.tool.execution.error_type": "exit_nonzero",
                    },
                ).end()
            batch.set_attributes(
                {
                    "acp.batch.admitted": 4,
                    "acp.input.external": False,
                    "acp.input.queued_prompt": False,
                    "acp.input.reliable": True,
                }
            )
            batch.end()
    return path


def test_a_restarted_guard_forgets_its_prompts_and_never_decides_more(
    binary: Path, tmp_path: Path
) -> None:
    # The same processes (same instance IDs: the stem names them), in two halves.
    first = acp_batches(tmp_path / "loop.jsonl", range(2))
    (tmp_path / "rest").mkdir()
    second = acp_batches(tmp_path / "rest" / "loop.jsonl", range(2, 3))
    whole, _ = replay_counts(first, second)
    assert whole[("prod", "1.0.0", "would_stop")] == 1  # the loop, uninterrupted, would stop

    before, _ = replay_counts(first)
    guard = Guard(binary, tmp_path, "before")
    try:
        guard.send(first)
        wait_for("the first half to be decided", settled(lambda: log_counts(guard.logs), before))
    finally:
        guard.collector.stop()
    restarted = Guard(binary, tmp_path, "after")
    try:
        restarted.send(second)
        # What a guard that never saw the first half decides: the third batch starts a new
        # candidate, tracked again, and nothing would stop.
        after, _ = replay_counts(second)
        assert set(after) == {key for key in before if key[2] == "tracked"}
        wait_for(
            "the second half to be decided", settled(lambda: log_counts(restarted.logs), after)
        )
    finally:
        restarted.collector.stop()
    total = log_counts(guard.logs) + log_counts(restarted.logs)
    assert total[("prod", "1.0.0", "would_stop")] == 0
    assert {a["mode"] for log in (guard.logs, restarted.logs) for _, _, a in transitions(log)} == {
        "shadow"
    }
    assert not any(decision in ("warned", "stopped") for _, _, decision in total)
