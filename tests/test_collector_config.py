"""The deployable material in ``collector-config/`` agrees with the package it serves.

The collector applies the registry's policy to agent telemetry only (an allow-list on GenAI
spans, the deny-list on agent services' other telemetry), its listeners are local by default,
its pipelines are whole, and the Prometheus rules and the Grafana dashboard query the names the
guard's counters really get, with label values from the guard's closed sets.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from otel_guard.guard.telemetry import DECISIONS_METRIC, DIAGNOSTICS_METRIC, METRIC_ATTRIBUTE_VALUES
from otel_guard.privacy.pseudonym import PSEUDONYM_KEY_ENV
from otel_guard.privacy.sensitive import (
    CLASSIFIED_ERROR_TYPE,
    ERROR_TYPE_KEYS,
    GENAI_ALLOWED_KEYS,
    GENAI_MARKER_KEYS,
    MCP_MARKER_KEYS,
    MCP_SERVER_KEYS,
    MODEL_OPERATIONS,
    PSEUDONYMOUS_KEYS,
    SENSITIVE_KEY_PATTERNS,
    SENSITIVE_KEYS,
    allowed_key,
    is_genai_key,
    is_sensitive,
)

yaml = pytest.importorskip(
    "yaml", reason="the collector tests read YAML with PyYAML ('test' extra)"
)

ROOT = Path(__file__).resolve().parent.parent
CONFIG_DIR = ROOT / "collector-config"
OTELCOL = CONFIG_DIR / "otelcol.yaml"
RULES = CONFIG_DIR / "prometheus" / "rules.yml"
RULES_TEST = CONFIG_DIR / "prometheus" / "rules.test.yml"
DASHBOARD = CONFIG_DIR / "grafana" / "otel-guard-shadow.json"

# The Prometheus names of the guard's counters: dots become underscores, the `{decision}` and
# `{diagnostic}` annotation units add no suffix, and a monotonic counter gains `_total`.
DECISIONS_SERIES = DECISIONS_METRIC.replace(".", "_") + "_total"
DIAGNOSTICS_SERIES = DIAGNOSTICS_METRIC.replace(".", "_") + "_total"
# Resource attributes deployment.environment.name and service.version, as labels, and the older
# deployment.environment that queries fall back to.
RESOURCE_LABELS = frozenset(
    {"deployment_environment_name", "service_version", "deployment_environment"}
)

# Where the deny-list applies to agent services, per signal.
TRANSFORM_CONTEXTS = {
    "trace_statements": ["resource", "span", "spanevent"],
    "log_statements": ["resource", "log"],
    "metric_statements": ["resource"],
}
LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})
AGENT_SERVICE = 'IsMatch({}attributes["service.name"], "${{env:OTELCOL_AGENT_SERVICES:-.*}}")'

_ENV_REFERENCE = re.compile(r"\$\{env:(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>[^}]*))?\}")
_DELETE_MATCHING = re.compile(
    r'^delete_matching_keys\(attributes, "(?P<pattern>(?:[^"\\]|\\.)*)"\)$'
)
_KEEP_MATCHING = re.compile(r'^keep_matching_keys\(attributes, "(?P<pattern>(?:[^"\\]|\\.)*)"\)$')


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


@functools.cache
def deny_regexes() -> tuple[re.Pattern[str], ...]:
    config = load(OTELCOL)
    statements = groups(config, "transform/sensitive", "trace_statements")["span"]["statements"]
    return tuple(re.compile(p) for p in deny_patterns(statements))


@functools.cache
def span_keep_regex() -> re.Pattern[str]:
    genai = groups(load(OTELCOL), "transform/genai", "trace_statements")
    return re.compile(keep_pattern(genai["span"]["statements"]))


@pytest.fixture(scope="module")
def otelcol() -> dict[str, Any]:
    config = load(OTELCOL)
    assert isinstance(config, dict)
    return config


def expand_env(value: str, environment: dict[str, str]) -> str:
    """Expand ``${env:NAME}`` and ``${env:NAME:-default}`` as the collector does."""

    def replace(match: re.Match[str]) -> str:
        found = environment.get(match["name"], "")
        if found == "" and match["default"] is not None:
            return match["default"]
        return found

    return _ENV_REFERENCE.sub(replace, value)


def host_of(endpoint: str) -> str:
    host, _, port = endpoint.rpartition(":")
    assert port.isdigit(), endpoint
    return host


def ottl_string(body: str) -> str:
    """The value of an OTTL string literal's body (backslash escapes undone)."""
    return re.sub(r"\\(.)", r"\1", body)


def deny_patterns(statements: list[str]) -> list[str]:
    patterns = []
    for statement in statements:
        match = _DELETE_MATCHING.match(statement)
        assert match is not None, f"unexpected transform statement: {statement}"
        patterns.append(ottl_string(match["pattern"]))
    return patterns


def keep_pattern(statements: list[str]) -> str:
    (pattern,) = [
        ottl_string(m["pattern"]) for s in statements if (m := _KEEP_MATCHING.match(s)) is not None
    ]
    assert statements[-1].startswith("keep_matching_keys"), "the allow-list must come last"
    return pattern


def genai_condition(prefix: str) -> str:
    return " or ".join(f'{prefix}attributes["{key}"] != nil' for key in GENAI_MARKER_KEYS)


def groups(config: dict[str, Any], processor: str, signal: str) -> dict[str, dict[str, Any]]:
    """A processor's statement groups by context; of two groups of one context, the last."""
    found = config["processors"][processor][signal]
    return {group["context"]: group for group in found}


def all_groups(config: dict[str, Any], processor: str, signal: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = config["processors"][processor][signal]
    return found


# Span links' attributes are out of OTTL's reach: a span whose attributes the collector redacts
# loses its links, counted as dropped, and its status description.
LINKS_AND_STATUS = [
    'set(status.message, "")',
    "set(dropped_links_count, dropped_links_count + Len(links)) where Len(links) > 0",
    "set(links, nil)",
]


# -- otelcol.yaml: GenAI spans ---------------------------------------------------------------


def test_genai_spans_are_recognised_by_the_registry_marker_keys(otelcol: dict[str, Any]) -> None:
    genai = groups(otelcol, "transform/genai", "trace_statements")
    assert list(genai) == ["spanevent", "span"]  # events first, while markers are all there
    assert genai["span"]["conditions"] == [genai_condition("")]
    assert genai["spanevent"]["conditions"] == [genai_condition("span.")]
    assert all(is_genai_key(key) for key in GENAI_MARKER_KEYS)


def test_genai_spans_keep_exactly_the_allow_list(otelcol: dict[str, Any]) -> None:
    genai = groups(otelcol, "transform/genai", "trace_statements")
    span_keep = re.compile(keep_pattern(genai["span"]["statements"]))
    event_keep = re.compile(keep_pattern(genai["spanevent"]["statements"]))
    rewritten = set(PSEUDONYMOUS_KEYS) | set(ERROR_TYPE_KEYS)
    for key in [*GENAI_ALLOWED_KEYS, *rewritten, *SENSITIVE_KEYS, "gen_ai.usage.input_tokens"]:
        allowed = allowed_key(key) is not None
        assert (span_keep.search(key) is not None) == (allowed or key in rewritten), key
        assert (event_keep.search(key) is not None) == allowed, key


@given(st.text(alphabet="abcdegilmnoprstuyz_.AIT", max_size=30))
def test_collector_allow_list_selects_the_keys_the_process_keeps(key: str) -> None:
    span_keep = span_keep_regex()
    expected = allowed_key(key) is not None or key in PSEUDONYMOUS_KEYS or key in ERROR_TYPE_KEYS
    assert (span_keep.search(key) is not None) == expected


def test_genai_spans_get_pseudonyms_classified_errors_and_their_operation_name(
    otelcol: dict[str, Any],
) -> None:
    statements = groups(otelcol, "transform/genai", "trace_statements")["span"]["statements"]
    text = "\n".join(statements)
    for key, prefix in PSEUDONYMOUS_KEYS.items():
        assert f'set(attributes["{key}"], Concat(["{prefix}", Substring(SHA256(' in text
        assert (
            f'delete_key(attributes, "{key}") where "${{env:{PSEUDONYM_KEY_ENV}:-}}" == ""' in text
        )
    classified = f'"^{CLASSIFIED_ERROR_TYPE.pattern}$"'.replace("\\", "\\\\")
    for key in ERROR_TYPE_KEYS:
        assert f'IsMatch(attributes["{key}"], {classified})' in text, key
    assert 'set(attributes["error.type"], "_OTHER")' in text
    operations = "|".join(sorted(MODEL_OPERATIONS))
    assert f'IsMatch(attributes["gen_ai.operation.name"], "^(?:{operations})$")' in text
    assert 'set(status.message, "")' in statements
    assert statements[-1 - len(LINKS_AND_STATUS) : -1] == LINKS_AND_STATUS


# -- otelcol.yaml: agent services' other telemetry -------------------------------------------


def test_the_deny_list_is_exactly_the_registry_in_every_context(otelcol: dict[str, Any]) -> None:
    expected = [f"(?i)^{key.replace('.', chr(92) + '.')}$" for key in sorted(SENSITIVE_KEYS)]
    expected += [f"(?i)^(?:{pattern})$" for pattern in SENSITIVE_KEY_PATTERNS]
    for signal, contexts in TRANSFORM_CONTEXTS.items():
        found = groups(otelcol, "transform/sensitive", signal)
        assert list(found) == contexts
        for context, group in found.items():
            assert deny_patterns(group["statements"]) == expected, (signal, context)


def test_agent_services_spans_lose_links_and_status_messages_too(otelcol: dict[str, Any]) -> None:
    # Before the deny-list's span group, with its condition: agent services' other spans.
    spans = [
        group
        for group in all_groups(otelcol, "transform/sensitive", "trace_statements")
        if group["context"] == "span"
    ]
    assert len(spans) == 2
    assert spans[0]["statements"] == LINKS_AND_STATUS
    assert spans[0]["conditions"] == spans[1]["conditions"]


def test_the_deny_list_applies_to_agent_services_only_and_never_to_genai_spans(
    otelcol: dict[str, Any],
) -> None:
    for signal in TRANSFORM_CONTEXTS:
        for group in all_groups(otelcol, "transform/sensitive", signal):
            context = group["context"]
            (condition,) = group["conditions"]
            prefix = "" if context == "resource" else "resource."
            assert condition.startswith(AGENT_SERVICE.format(prefix)), (signal, context)
            if context == "span":
                assert condition.endswith(f" and not ({genai_condition('')})")
            if context == "spanevent":
                assert condition.endswith(f" and not ({genai_condition('span.')})")


@given(
    key=st.one_of(
        st.sampled_from(sorted(SENSITIVE_KEYS)),
        st.builds(
            lambda key, prefix, suffix, upper: (
                (prefix + key + suffix).upper() if upper else prefix + key + suffix
            ),
            st.sampled_from(sorted(SENSITIVE_KEYS)),
            st.sampled_from(["", "x", "x.", "."]),
            st.sampled_from(["", "s", ".x", "_", ".args", ".path", "-1"]),
            st.booleans(),
        ),
        st.text(alphabet="abcdefgimnoprstuyAPU_.-", max_size=30),
    )
)
def test_collector_deny_list_selects_the_keys_the_process_removes(key: str) -> None:
    # The collector searches its patterns anywhere in a key (Go regexp MatchString); anchored,
    # they must select exactly the keys the in-process registry removes, in any letter case.
    assert any(p.search(key) for p in deny_regexes()) == is_sensitive(key)


def test_listeners_bind_to_localhost_by_default(otelcol: dict[str, Any]) -> None:
    endpoints = [
        protocol["endpoint"] for protocol in otelcol["receivers"]["otlp"]["protocols"].values()
    ]
    endpoints.append(otelcol["exporters"]["prometheus"]["endpoint"])
    endpoints.append(otelcol["extensions"]["health_check"]["endpoint"])
    assert len(endpoints) == 4
    for endpoint in endpoints:
        assert host_of(expand_env(endpoint, {})) in LOCAL_HOSTS, endpoint
        # Each one can be opened up for a gateway tier without editing the file.
        assert _ENV_REFERENCE.fullmatch(endpoint), endpoint
        assert host_of(expand_env(endpoint, {_env_name(endpoint): "0.0.0.0:1"})) == "0.0.0.0"


def _env_name(reference: str) -> str:
    match = _ENV_REFERENCE.fullmatch(reference)
    assert match is not None
    return match["name"]


def test_traces_and_logs_go_to_an_otlp_http_endpoint_from_the_environment(
    otelcol: dict[str, Any],
) -> None:
    endpoint = otelcol["exporters"]["otlphttp"]["endpoint"]
    match = _ENV_REFERENCE.fullmatch(endpoint)
    # No default: a collector without a backend configured must refuse to start.
    assert match is not None and match["default"] is None
    pipelines = otelcol["service"]["pipelines"]
    assert pipelines["traces"]["exporters"] == ["otlphttp"]
    assert pipelines["logs"]["exporters"] == ["otlphttp"]


def test_prometheus_exporter_turns_resource_attributes_into_labels(
    otelcol: dict[str, Any],
) -> None:
    prometheus = otelcol["exporters"]["prometheus"]
    assert prometheus["resource_to_telemetry_conversion"] == {"enabled": True}
    # Suffixes (_total) must stay on, or the rules' series names would not exist.
    assert prometheus.get("add_metric_suffixes", True) is True
    assert "translation_strategy" not in prometheus
    assert otelcol["service"]["pipelines"]["metrics"]["exporters"] == ["prometheus"]


def test_pipelines_exist_and_reference_defined_components(otelcol: dict[str, Any]) -> None:
    service = otelcol["service"]
    pipelines = service["pipelines"]
    assert sorted(pipelines) == ["logs", "metrics", "traces", "traces/replay"]
    for name, pipeline in pipelines.items():
        for kind in ("receivers", "processors", "exporters"):
            assert pipeline[kind], (name, kind)
            for component in pipeline[kind]:
                assert component in otelcol[kind], (name, component)
        processors = pipeline["processors"]
        assert processors[0] == "memory_limiter", name
        assert processors[-1] == "batch", name
        assert "transform/sensitive" in processors, name
    # GenAI spans get the allow-list first; the deny-list skips them, so it must come after.
    for traces in ("traces", "traces/replay"):
        assert pipelines[traces]["processors"] == [
            "memory_limiter",
            "transform/genai",
            "transform/sensitive",
            "batch",
        ]
    for extension in service["extensions"]:
        assert extension in otelcol["extensions"]
    used = {
        component
        for pipeline in pipelines.values()
        for kind in ("receivers", "processors", "exporters")
        for component in pipeline[kind]
    }
    defined = {c for kind in ("receivers", "processors", "exporters") for c in otelcol[kind]}
    assert defined == used


def test_the_traces_replay_reads_are_written_by_a_file_exporter(otelcol: dict[str, Any]) -> None:
    exporter = otelcol["exporters"]["file/replay"]
    # Keys of the contrib file exporter only; replay reads both its formats and zstd.
    assert set(exporter) <= {"path", "format", "compression", "rotation", "flush_interval"}
    assert exporter["format"] in ("json", "proto") and exporter["compression"] == "zstd"
    assert exporter["path"].startswith("${env:OTELCOL_REPLAY_TRACES_PATH:-")
    assert set(exporter["rotation"]) <= {"max_megabytes", "max_days", "max_backups", "localtime"}
    assert otelcol["service"]["pipelines"]["traces/replay"]["exporters"] == ["file/replay"]


# -- Prometheus rules and the dashboard ------------------------------------------------------


def rules() -> list[dict[str, Any]]:
    document = load(RULES)
    return [rule for group in document["groups"] for rule in group["rules"]]


def dashboard_expressions() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def test_every_rule_and_alert_has_a_promtool_test() -> None:
    document = load(RULES_TEST)
    assert document["rule_files"] == ["rules.yml"]
    tested_expressions = {
        case["expr"] for test in document["tests"] for case in test.get("promql_expr_test", [])
    }
    firing = {
        case["alertname"]
        for test in document["tests"]
        for case in test.get("alert_rule_test", [])
        if case["exp_alerts"]
    }
    quiet = {
        case["alertname"]
        for test in document["tests"]
        for case in test.get("alert_rule_test", [])
        if not case["exp_alerts"]
    }
    records = {rule["record"] for rule in rules() if "record" in rule}
    alerts = {rule["alert"] for rule in rules() if "alert" in rule}
    assert len(records) == 6
    assert len(alerts) == 3
    assert records <= tested_expressions
    assert alerts <= firing
    assert alerts <= quiet


_SELECTOR = re.compile(r"(?P<metric>[a-zA-Z_:][a-zA-Z0-9_:]*)\{(?P<matchers>[^}]*)\}")
_MATCHER = re.compile(
    r'(?P<label>[a-zA-Z_][a-zA-Z0-9_]*)\s*(?P<op>=~|!~|!=|=)\s*"(?P<value>[^"]*)"'
)
_GROUPING = re.compile(r"\bby\s*\((?P<labels>[^)]*)\)")
_NAME = re.compile(r"\b(acp_[a-z0-9_]+|otel_guard:[a-z0-9_:]+)\b")


def queried_expressions() -> list[str]:
    return [rule["expr"] for rule in rules()] + dashboard_expressions()


def test_queries_use_the_exported_series_names() -> None:
    allowed = {DECISIONS_SERIES, DIAGNOSTICS_SERIES}
    for expression in queried_expressions():
        names = set(_NAME.findall(expression))
        assert names, expression
        assert names <= allowed, expression


def test_queries_use_only_labels_and_values_the_guard_emits() -> None:
    known_labels = set(METRIC_ATTRIBUTE_VALUES) | RESOURCE_LABELS
    for expression in queried_expressions():
        for selector in _SELECTOR.finditer(expression):
            for matcher in _MATCHER.finditer(selector["matchers"]):
                label, value = matcher["label"], matcher["value"]
                assert label in known_labels, (label, expression)
                if label in RESOURCE_LABELS:
                    continue
                values = value.split("|") if matcher["op"] == "=~" else [value]
                assert set(values) <= METRIC_ATTRIBUTE_VALUES[label], (label, expression)
        for grouping in _GROUPING.finditer(expression):
            labels = {name.strip() for name in grouping["labels"].split(",")}
            assert labels <= known_labels, (labels, expression)


NEWER_ENVIRONMENT = 'deployment_environment_name=~"$environment"'
OLDER_ENVIRONMENT = 'deployment_environment_name="", deployment_environment=~"$environment"'


def test_dashboard_filters_every_query_by_environment_and_version() -> None:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    variables = {variable["name"]: variable for variable in dashboard["templating"]["list"]}
    # Either environment key lists an environment: the newer one, else the older one.
    environment = variables["environment"]
    assert environment["query"] == (
        "query_result(count by (deployment_environment_name) "
        f'({DECISIONS_SERIES}{{deployment_environment_name!=""}}) '
        "or label_replace(count by (deployment_environment) "
        f'({DECISIONS_SERIES}{{deployment_environment_name="", deployment_environment!=""}}), '
        '"deployment_environment_name", "$1", "deployment_environment", "(.+)"))'
    )
    assert environment["regex"] == '/deployment_environment_name="([^"]+)"/'
    version = variables["version"]
    assert version["query"] == (
        f"query_result(count by (service_version) ({DECISIONS_SERIES}{{{NEWER_ENVIRONMENT}}} "
        f"or {DECISIONS_SERIES}{{{OLDER_ENVIRONMENT}}}))"
    )
    assert version["regex"] == '/service_version="([^"]+)"/'
    titles = [panel["title"] for panel in dashboard["panels"]]
    for wanted in (
        "Decisions over time",
        "Would-warn and would-stop rates",
        "Reset reasons",
        "Mode split",
        "Diagnostics",
    ):
        assert wanted in titles
    for expression in dashboard_expressions():
        for selector in _SELECTOR.finditer(expression):
            matchers = selector["matchers"]
            # Each selector filters by one key, and the older key only where the newer is absent.
            assert matchers.startswith((NEWER_ENVIRONMENT, OLDER_ENVIRONMENT)), expression
            assert 'service_version=~"$version"' in matchers, expression
            if matchers.startswith(OLDER_ENVIRONMENT):
                assert selector.group(0).replace(OLDER_ENVIRONMENT, NEWER_ENVIRONMENT) in (
                    expression
                ), expression


def test_mcp_calls_lose_the_host_that_names_their_server_before_the_markers_change(
    otelcol: dict[str, Any],
) -> None:
    statements = groups(otelcol, "transform/genai", "trace_statements")["span"]["statements"]
    markers = " or ".join(f'attributes["{key}"] != nil' for key in MCP_MARKER_KEYS)
    deletions = [f'delete_key(attributes, "{key}") where {markers}' for key in MCP_SERVER_KEYS]
    for deletion in deletions:
        assert deletion in statements
        first_rewrite = min(i for i, s in enumerate(statements) if s.startswith("set("))
        assert statements.index(deletion) < first_rewrite
