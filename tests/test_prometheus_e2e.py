"""End to end: simulated agents with the guard, scraped by a real Prometheus server.

Two agent processes (one resource each: environment and service version) run the guard over a
real ``TracerProvider`` and serve their metrics on 127.0.0.1 through the OpenTelemetry
Prometheus exporter. A Prometheus server started here scrapes both every second and loads
``collector-config/prometheus/rules.yml``. Through its HTTP API the test then checks the guard's
series, names, labels and values, and that every PromQL expression of the rules and of the
Grafana dashboard evaluates without error. Run with ``-s`` to see the query results.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import pytest

pytest.importorskip(
    "opentelemetry.exporter.prometheus",
    reason="the 'prometheus' extra (opentelemetry-exporter-prometheus) is not installed",
)
PROMETHEUS_BINARY = shutil.which("prometheus")
pytestmark = pytest.mark.skipif(
    PROMETHEUS_BINARY is None,
    reason="no 'prometheus' binary on PATH (Debian: apt-get install prometheus)",
)

from opentelemetry.exporter.prometheus import PrometheusMetricReader  # noqa: E402
from opentelemetry.sdk._logs import LoggerProvider  # noqa: E402
from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402
from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.trace import Span, set_span_in_context  # noqa: E402
from prometheus_client import CollectorRegistry, make_wsgi_app  # noqa: E402
from test_collector_config import (  # noqa: E402
    DASHBOARD,
    DECISIONS_SERIES,
    DIAGNOSTICS_SERIES,
    RULES,
    dashboard_expressions,
    rules,
)

from otel_guard import GuardSpanProcessor  # noqa: E402
from otel_guard.guard.telemetry import DECISIONS_METRIC, DIAGNOSTICS_METRIC  # noqa: E402
from otel_guard.spans import attributes as attr  # noqa: E402

# The resource attributes that become labels on every series, as the collector's
# resource_to_telemetry_conversion makes them.
RESOURCE_LABEL_KEYS = frozenset({"deployment.environment.name", "service.version"})
SCRAPE_JOB = "agents"
DEADLINE_SECONDS = 60.0
SAMPLES_WANTED = 5
# Grafana's variables as Grafana would expand them for this scrape interval and these agents.
DASHBOARD_VARIABLES = (
    {"$environment": ".*", "$version": ".*", "$__rate_interval": "4s", "$__range": "5m"},
    {
        "$environment": "staging",
        "$version": "(1\\\\.2\\\\.3|1\\\\.3\\\\.0)",
        "$__rate_interval": "4s",
        "$__range": "5m",
    },
)

_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


# -- a simulated agent process ---------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    status: str = "error"
    execution: str | None = "error"
    error_type: str | None = "exit_nonzero"


FAIL = Call()
OK = Call(status="success", execution="success", error_type=None)
CANCELLED = Call(status="cancelled", execution="cancelled", error_type=None)
CONTRACT_VIOLATION = Call(status="success", execution="error", error_type="exit_nonzero")
UNKNOWN = Call(status="error", execution="unknown", error_type=None)


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


class Agent:
    """One agent process: its resource, the guard, and its metrics served on 127.0.0.1."""

    def __init__(self, environment: str, version: str, mode: str) -> None:
        self.environment = environment
        self.version = version
        resource = Resource.create(
            {
                "service.name": "agent",
                "service.version": version,
                "deployment.environment.name": environment,
            }
        )
        self.registry = CollectorRegistry()
        self.memory = InMemoryMetricReader()
        self.meter_provider = MeterProvider(
            resource=resource,
            metric_readers=[
                PrometheusMetricReader(
                    registry=self.registry,
                    resource_attribute_filter=RESOURCE_LABEL_KEYS.__contains__,
                ),
                self.memory,
            ],
        )
        self.logger_provider = LoggerProvider(resource=resource)
        self.tracer_provider = TracerProvider(resource=resource)
        self.tracer_provider.add_span_processor(
            GuardSpanProcessor(
                mode=mode,
                meter_provider=self.meter_provider,
                logger_provider=self.logger_provider,
            )
        )
        self.tracer = self.tracer_provider.get_tracer("agent")
        self._calls = 0
        self.server: WSGIServer = make_server(
            "127.0.0.1", 0, make_wsgi_app(self.registry), handler_class=_QuietHandler
        )
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.server.server_port}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()
        self.logger_provider.shutdown()

    def batch(self, prompt_id: str, calls: Sequence[Call], leave_open: int = 0) -> list[Span]:
        """One settled tool batch; returns the tool spans left open (to end late)."""
        batch_span = self.tracer.start_span("tool_batch", attributes={attr.PROMPT_ID: prompt_id})
        context = set_span_in_context(batch_span)
        spans = [self._tool_span(call, context) for call in calls]
        settled = spans[: len(spans) - leave_open]
        for span in settled:
            span.end()
        batch_span.set_attribute(attr.BATCH_ADMITTED, len(spans))
        batch_span.set_attribute(attr.INPUT_EXTERNAL, False)
        batch_span.set_attribute(attr.INPUT_QUEUED_PROMPT, False)
        batch_span.set_attribute(attr.INPUT_RELIABLE, True)
        batch_span.end()
        return spans[len(settled) :]

    def _tool_span(self, call: Call, context: Any) -> Span:
        self._calls += 1
        attributes: dict[str, Any] = {
            attr.OPERATION_NAME: attr.EXECUTE_TOOL,
            attr.TOOL_NAME: "run_shell",
            attr.TOOL_CALL_ID: f"call-{self._calls}",
            attr.TOOL_TYPE: "native",
            attr.TOOL_STATUS: call.status,
        }
        if call.execution is not None:
            attributes[attr.TOOL_EXECUTION_STATUS] = call.execution
        if call.error_type is not None:
            attributes[attr.TOOL_EXECUTION_ERROR_TYPE] = call.error_type
        return self.tracer.start_span("execute_tool", context=context, attributes=attributes)

    def counts(self, metric: str, key: str) -> dict[str, int]:
        """What the SDK itself counted, by one attribute."""
        data = self.memory.get_metrics_data()
        counts: dict[str, int] = {}
        for resource_metrics in data.resource_metrics if data is not None else []:
            for scope_metrics in resource_metrics.scope_metrics:
                for found in scope_metrics.metrics:
                    if found.name != metric:
                        continue
                    for point in found.data.data_points:  # type: ignore[union-attr]
                        value = str((point.attributes or {})[key])
                        counts[value] = counts.get(value, 0) + int(point.value)  # type: ignore[union-attr]
        return counts


def run_loop(agent: Agent, prompt_id: str) -> None:
    """Three failing batches of four: tracked, then warned (or would_warn), then would_stop."""
    for _ in range(3):
        agent.batch(prompt_id, [FAIL] * 4)


def run_resets_and_a_late_span(agent: Agent) -> None:
    """Four prompts that start a candidate and reset it, and one late tool span."""
    for prompt, ending in (
        ("recovers", OK),
        ("cancelled", CANCELLED),
        ("contract", CONTRACT_VIOLATION),
        ("unknown", UNKNOWN),
    ):
        agent.batch(prompt, [FAIL] * 4)
        agent.batch(prompt, [ending])
    for late in agent.batch("late", [FAIL, FAIL], leave_open=1):
        late.end()


# -- the Prometheus server -------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class PrometheusApi:
    def __init__(self, port: int, log: Path) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.log = log

    def get(self, path: str, **params: str) -> Any:
        url = f"{self.base}{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with _NO_PROXY.open(url, timeout=10) as response:
                body = json.load(response)
        except urllib.error.HTTPError as error:
            body = json.load(error)
        return body

    def query(self, expression: str) -> list[dict[str, Any]]:
        body = self.get("/api/v1/query", query=expression)
        assert body["status"] == "success", (expression, body)
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def query_range(self, expression: str, seconds: int = 30) -> list[dict[str, Any]]:
        end = time.time()
        body = self.get(
            "/api/v1/query_range",
            query=expression,
            start=f"{end - seconds:.3f}",
            end=f"{end:.3f}",
            step="1",
        )
        assert body["status"] == "success", (expression, body)
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def log_tail(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")[-2000:]


def wait_for(what: str, check: Callable[[], bool], api: PrometheusApi | None = None) -> None:
    deadline = time.monotonic() + DEADLINE_SECONDS
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    tail = api.log_tail() if api is not None else ""
    raise AssertionError(f"timed out after {DEADLINE_SECONDS:.0f}s waiting for {what}\n{tail}")


def start_prometheus(
    tmp_path: Path, targets: list[str]
) -> tuple[subprocess.Popen[bytes], PrometheusApi]:
    # JSON is YAML, so the scrape configuration needs no YAML writer.
    config = tmp_path / "prometheus.yml"
    config.write_text(
        json.dumps(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(RULES)],
                "scrape_configs": [
                    {"job_name": SCRAPE_JOB, "static_configs": [{"targets": targets}]}
                ],
            }
        ),
        encoding="utf-8",
    )
    log = tmp_path / "prometheus.log"
    assert PROMETHEUS_BINARY is not None
    for _ in range(3):
        port = free_port()
        with log.open("wb") as sink:
            process = subprocess.Popen(
                [
                    PROMETHEUS_BINARY,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={tmp_path / 'data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--log.level=warn",
                ],
                stdout=sink,
                stderr=subprocess.STDOUT,
                cwd=tmp_path,
            )
        api = PrometheusApi(port, log)
        deadline = time.monotonic() + DEADLINE_SECONDS
        while time.monotonic() < deadline and process.poll() is None:
            try:
                with _NO_PROXY.open(f"{api.base}/-/ready", timeout=2) as response:
                    if response.status == 200:
                        return process, api
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        stop(process)
        # The port may have been taken between probing and binding: try another one.
    raise AssertionError(f"prometheus did not become ready\n{log.read_text(errors='replace')}")


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


@dataclass
class Deployment:
    api: PrometheusApi
    shadow: Agent
    warn: Agent


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    shadow = Agent("staging", "1.2.3", "shadow")
    warn = Agent("staging", "1.3.0", "warn")
    process: subprocess.Popen[bytes] | None = None
    try:
        # Before the first scrape: series that start with their first value already counted.
        run_loop(shadow, "loop-1")
        run_loop(warn, "loop-1")
        process, api = start_prometheus(
            tmp_path_factory.mktemp("prometheus"), [shadow.target, warn.target]
        )
        wait_for("a scrape of both agents", lambda: scraped(api, 2), api)
        # While Prometheus scrapes: counters grow, so rates and increases are above zero.
        run_loop(shadow, "loop-2")
        run_resets_and_a_late_span(shadow)
        run_loop(warn, "loop-2")
        wait_for(
            "the second half to be scraped",
            lambda: decision_totals(api) == EXPECTED_DECISIONS and scraped(api, SAMPLES_WANTED),
            api,
        )
        yield Deployment(api, shadow, warn)
    finally:
        if process is not None:
            stop(process)
        shadow.close()
        warn.close()


EXPECTED_DECISIONS = {
    ("staging", "1.2.3", "shadow", "tracked"): 6.0,
    ("staging", "1.2.3", "shadow", "would_warn"): 2.0,
    ("staging", "1.2.3", "shadow", "would_stop"): 2.0,
    ("staging", "1.2.3", "shadow", "reset"): 4.0,
    ("staging", "1.3.0", "warn", "tracked"): 2.0,
    ("staging", "1.3.0", "warn", "warned"): 2.0,
    ("staging", "1.3.0", "warn", "would_stop"): 2.0,
}
DECISION_TOTALS = (
    f"sum by (deployment_environment_name, service_version, mode, decision) ({DECISIONS_SERIES})"
)


def decision_totals(api: PrometheusApi) -> dict[tuple[str, ...], float]:
    return by_labels(
        api.query(DECISION_TOTALS),
        "deployment_environment_name",
        "service_version",
        "mode",
        "decision",
    )


def scraped(api: PrometheusApi, samples: int) -> bool:
    """Every decision series of both agents has at least ``samples`` samples."""
    result = api.query(
        f"min by (service_version) (count_over_time({DECISIONS_SERIES}[1m])) >= {samples}"
    )
    return len(result) == 2


def by_labels(result: list[dict[str, Any]], *labels: str) -> dict[tuple[str, ...], float]:
    return {tuple(s["metric"].get(k, "") for k in labels): float(s["value"][1]) for s in result}


# -- what Prometheus saw ---------------------------------------------------------------------


def test_decisions_reach_prometheus_with_environment_and_version_labels(
    deployment: Deployment,
) -> None:
    seen = decision_totals(deployment.api)
    print(f"\n{DECISION_TOTALS}")
    for labels, value in sorted(seen.items()):
        named = dict(zip(("env", "version", "mode", "decision"), labels, strict=True))
        print(f"  {named} = {value:g}")
    assert seen == EXPECTED_DECISIONS
    # Prometheus holds exactly what each process counted.
    for agent in (deployment.shadow, deployment.warn):
        counted = agent.counts(DECISIONS_METRIC, "decision")
        assert {
            decision: int(value)
            for (_, version, _, decision), value in seen.items()
            if version == agent.version
        } == counted


def test_reset_reasons_reach_prometheus(deployment: Deployment) -> None:
    expression = (
        f'sum by (reset_reason) ({DECISIONS_SERIES}{{service_version="1.2.3", decision="reset"}})'
    )
    seen = by_labels(deployment.api.query(expression), "reset_reason")
    print(f"\n{expression}\n  {seen}")
    assert seen == {
        ("success",): 1.0,
        ("cancelled",): 1.0,
        ("contract_violation",): 1.0,
        ("unknown",): 1.0,
    }


def test_a_decision_series_carries_the_guard_attributes_and_resource_labels(
    deployment: Deployment,
) -> None:
    expression = f'{DECISIONS_SERIES}{{service_version="1.2.3", decision="would_stop"}}'
    result = deployment.api.query(expression)
    print(f"\n{expression}\n  {result}")
    assert len(result) == 1
    labels = dict(result[0]["metric"])
    assert labels.pop("instance") == deployment.shadow.target
    assert labels.pop("otel_scope_version")
    assert labels == {
        "__name__": DECISIONS_SERIES,
        "job": SCRAPE_JOB,
        "deployment_environment_name": "staging",
        "service_version": "1.2.3",
        "otel_scope_name": "otel_guard",
        "route": "acp_foreground",
        "mode": "shadow",
        "phase_before": "warned",
        "phase_after": "latched",
        "decision": "would_stop",
        "failure_count_bucket": "8+",
        "batch_count_bucket": "3+",
        "terminal_status": "error",
        "execution_status": "error",
        "tool_type": "native",
    }
    assert result[0]["value"][1] == "2"


def test_diagnostics_reach_prometheus(deployment: Deployment) -> None:
    expression = f"sum by (service_version, diagnostic) ({DIAGNOSTICS_SERIES})"
    seen = by_labels(deployment.api.query(expression), "service_version", "diagnostic")
    print(f"\n{expression}\n  {seen}")
    # The contract violation is a diagnostic beside its reset.
    assert seen == {("1.2.3", "late_span"): 1.0, ("1.2.3", "contract_violation"): 1.0}
    assert deployment.shadow.counts(DIAGNOSTICS_METRIC, "diagnostic") == {
        "late_span": 1,
        "contract_violation": 1,
    }


def test_resource_attributes_are_also_on_target_info(deployment: Deployment) -> None:
    # The exporter's default way of carrying the resource; joins on it need no filter option.
    result = deployment.api.query('target_info{service_name="agent"}')
    versions = {
        (s["metric"]["deployment_environment_name"], s["metric"]["service_version"]) for s in result
    }
    print(f"\ntarget_info versions: {sorted(versions)}")
    assert versions == {("staging", "1.2.3"), ("staging", "1.3.0")}


# -- every expression of the rules and of the dashboard --------------------------------------


def test_every_rule_loads_and_evaluates_in_the_server(deployment: Deployment) -> None:
    api = deployment.api
    expected = {rule.get("record") or rule.get("alert") for rule in rules()}

    def evaluated() -> list[dict[str, Any]] | None:
        groups = api.get("/api/v1/rules")["data"]["groups"]
        found = [rule for group in groups for rule in group["rules"]]
        if {rule["name"] for rule in found} != expected:
            return None
        if any(rule["lastEvaluation"].startswith("0001-") for rule in found):
            return None
        return found

    wait_for("every rule to be evaluated", lambda: evaluated() is not None, api)
    found = evaluated()
    assert found is not None
    print()
    for rule in found:
        print(f"  rule {rule['name']}: health={rule['health']}")
        assert rule["health"] == "ok", rule
        assert rule.get("lastError", "") == "", rule


def test_every_rule_expression_evaluates_without_error(deployment: Deployment) -> None:
    api = deployment.api
    ratio = "otel_guard:would_stop_per_candidate:ratio_rate1h"
    wait_for(f"{ratio} to be recorded", lambda: len(api.query(ratio)) == 2, api)
    print()
    for rule in rules():
        name = rule.get("record") or rule.get("alert")
        result = api.query(rule["expr"])
        print(f"  {name}: {[(s['metric'], s['value'][1]) for s in result]}")
    recorded = by_labels(api.query("otel_guard:decisions:rate5m"), "service_version", "decision")
    assert set(recorded) == {
        ("1.2.3", "tracked"),
        ("1.2.3", "would_warn"),
        ("1.2.3", "would_stop"),
        ("1.2.3", "reset"),
        ("1.3.0", "tracked"),
        ("1.3.0", "warned"),
        ("1.3.0", "would_stop"),
    }
    # One loop per version grew while scraped: both would-stop shares are positive.
    shares = by_labels(api.query(ratio), "service_version")
    assert set(shares) == {("1.2.3",), ("1.3.0",)}
    assert all(share > 0 for share in shares.values()), shares
    # Nothing stopped outside enforce and no internal error happened: no alert is active.
    assert api.get("/api/v1/alerts")["data"]["alerts"] == []


def test_every_dashboard_expression_evaluates_without_error(deployment: Deployment) -> None:
    print()
    for variables in DASHBOARD_VARIABLES:
        for template in dashboard_expressions():
            expression = template
            for name, value in variables.items():
                expression = expression.replace(name, value)
            assert "$" not in expression, expression
            instant = deployment.api.query(expression)
            ranged = deployment.api.query_range(expression)
            print(f"  {expression}\n    = {[(s['metric'], s['value'][1]) for s in instant]}")
            # Every panel has data for these agents, over the last 30 seconds at least.
            assert ranged, expression
    panels = {title: expression for title, expression in dashboard_panels(DASHBOARD_VARIABLES[0])}
    decisions = deployment.api.query(panels["Decisions over time"])
    assert {s["metric"]["decision"] for s in decisions} == {
        "tracked",
        "would_warn",
        "warned",
        "would_stop",
        "reset",
    }
    shares = deployment.api.query(panels["Warn and stop points per new candidate"])
    assert {s["metric"]["service_version"] for s in shares} == {"1.2.3", "1.3.0"}
    assert all(float(s["value"][1]) > 0 for s in shares), shares
    modes = deployment.api.query(panels["Mode split"])
    assert {s["metric"]["mode"] for s in modes} == {"shadow", "warn"}


def dashboard_panels(variables: dict[str, str]) -> list[tuple[str, str]]:
    """(panel title, first query) with the variables expanded."""
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    found = []
    for panel in dashboard["panels"]:
        expression = panel["targets"][0]["expr"]
        for name, value in variables.items():
            expression = expression.replace(name, value)
        found.append((panel["title"], expression))
    return found


def test_dashboard_variables_list_the_environments_and_versions(deployment: Deployment) -> None:
    api = deployment.api
    environments = api.get(
        "/api/v1/label/deployment_environment_name/values", **{"match[]": DECISIONS_SERIES}
    )["data"]
    versions = api.get(
        "/api/v1/label/service_version/values",
        **{"match[]": f'{DECISIONS_SERIES}{{deployment_environment_name=~"staging"}}'},
    )["data"]
    print(f"\nenvironment variable: {environments}; version variable: {versions}")
    assert environments == ["staging"]
    assert versions == ["1.2.3", "1.3.0"]
