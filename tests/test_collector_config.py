"""The deployable material in ``collector-config/`` agrees with the package it serves.

The collector's key lists are the sensitive-key registry, its listeners are local by default, its
pipelines are whole, and the Prometheus rules and the Grafana dashboard query the names the
guard's counters really get, with label values from the guard's closed sets.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from yaml_subset import YamlSubsetError, load, loads

from otel_guard.sensitive import SENSITIVE_KEY_PATTERNS, SENSITIVE_KEYS, is_sensitive
from otel_guard.telemetry import DECISIONS_METRIC, DIAGNOSTICS_METRIC, METRIC_ATTRIBUTE_VALUES

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

# Where the transform processor deletes sensitive attributes, per signal.
TRANSFORM_CONTEXTS = {
    "trace_statements": ["resource", "span", "spanevent"],
    "log_statements": ["resource", "log"],
    "metric_statements": ["resource"],
}
LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})

_ENV_REFERENCE = re.compile(r"\$\{env:(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>[^}]*))?\}")
_DELETE_KEY = re.compile(r'^delete_key\(attributes, "(?P<key>[^"\\]*)"\)$')
_DELETE_MATCHING = re.compile(
    r'^delete_matching_keys\(attributes, "(?P<pattern>(?:[^"\\]|\\.)*)"\)$'
)


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


def full_match_patterns() -> list[str]:
    return [f"^(?:{pattern})$" for pattern in SENSITIVE_KEY_PATTERNS]


def exact_key_patterns() -> list[str]:
    return [f"^{re.escape(key)}$" for key in sorted(SENSITIVE_KEYS)]


def read_statements(statements: list[str]) -> tuple[list[str], list[str]]:
    keys: list[str] = []
    patterns: list[str] = []
    for statement in statements:
        if (match := _DELETE_KEY.match(statement)) is not None:
            keys.append(match["key"])
        elif (match := _DELETE_MATCHING.match(statement)) is not None:
            patterns.append(ottl_string(match["pattern"]))
        else:
            raise AssertionError(f"unexpected transform statement: {statement}")
    return keys, patterns


# -- the reader itself -----------------------------------------------------------------------


def test_reader_reads_anchors_block_scalars_and_flow_sequences() -> None:
    text = (
        "a:\n"
        "  list: &items\n"
        "    - 'x''y'\n"
        '    - "q\\\\.r"\n'
        "  again: *items\n"
        "  flow: [one, two]  # comment\n"
        "b: |\n"
        "  line one\n"
        "    indented\n"
        "c:\n"
        "- k: 1\n"
        "  f: 0.5\n"
        "- plain: ${env:X:-localhost:1}\n"
    )
    assert loads(text) == {
        "a": {"list": ["x'y", "q\\.r"], "again": ["x'y", "q\\.r"], "flow": ["one", "two"]},
        "b": "line one\n  indented\n",
        "c": [{"k": 1, "f": 0.5}, {"plain": "${env:X:-localhost:1}"}],
    }


def test_reader_names_file_and_line_of_unsupported_syntax() -> None:
    with pytest.raises(YamlSubsetError, match=r"^cfg\.yaml:3: unknown alias \*missing$"):
        loads("a: 1\nb: 2\nc: *missing\n", "cfg.yaml")
    with pytest.raises(YamlSubsetError, match=r"^cfg\.yaml:2: duplicate key 'a'$"):
        loads("a: 1\na: 2\n", "cfg.yaml")


# -- otelcol.yaml ----------------------------------------------------------------------------


def test_transform_deletes_exactly_the_registry_in_every_context(
    otelcol: dict[str, Any],
) -> None:
    transform = otelcol["processors"]["transform/sensitive"]
    for signal, contexts in TRANSFORM_CONTEXTS.items():
        groups = transform[signal]
        assert [group["context"] for group in groups] == contexts
        for group in groups:
            keys, patterns = read_statements(group["statements"])
            assert sorted(keys) == sorted(SENSITIVE_KEYS), (signal, group["context"])
            assert len(keys) == len(set(keys))
            assert patterns == full_match_patterns(), (signal, group["context"])


def test_redaction_masks_exactly_the_registry(otelcol: dict[str, Any]) -> None:
    redaction = otelcol["processors"]["redaction/sensitive"]
    # Without allow_all_keys the processor would delete every attribute not listed.
    assert redaction["allow_all_keys"] is True
    assert redaction["summary"] == "silent"
    assert redaction["blocked_key_patterns"] == exact_key_patterns() + full_match_patterns()


@given(
    key=st.one_of(
        st.sampled_from(sorted(SENSITIVE_KEYS)),
        st.builds(
            lambda key, prefix, suffix: prefix + key + suffix,
            st.sampled_from(sorted(SENSITIVE_KEYS)),
            st.sampled_from(["", "x", "x.", "."]),
            st.sampled_from(["", "s", ".x", "_", ".args", ".path"]),
        ),
        st.text(alphabet="abcdefgimnoprstuy_.", max_size=30),
    )
)
def test_collector_patterns_select_the_keys_the_process_removes(key: str) -> None:
    # The collector searches its patterns anywhere in a key (Go regexp MatchString); anchored,
    # they must select exactly the keys the in-process registry removes.
    config = load(OTELCOL)
    blocked = config["processors"]["redaction/sensitive"]["blocked_key_patterns"]
    statements = config["processors"]["transform/sensitive"]["trace_statements"][1]["statements"]
    keys, patterns = read_statements(statements)
    assert any(re.search(p, key) for p in blocked) == is_sensitive(key)
    assert (key in keys or any(re.search(p, key) for p in patterns)) == is_sensitive(key)


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
    assert sorted(pipelines) == ["logs", "metrics", "traces"]
    for name, pipeline in pipelines.items():
        for kind in ("receivers", "processors", "exporters"):
            assert pipeline[kind], (name, kind)
            for component in pipeline[kind]:
                assert component in otelcol[kind], (name, component)
        processors = pipeline["processors"]
        assert processors[0] == "memory_limiter", name
        assert processors[-1] == "batch", name
        assert "transform/sensitive" in processors, name
    for name in ("traces", "logs"):
        processors = pipelines[name]["processors"]
        assert processors.index("transform/sensitive") < processors.index("redaction/sensitive")
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
