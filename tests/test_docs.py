"""The README and ``docs/`` say only what the code does.

Every Python example runs; every ``otel-guard`` flag exists in the command's help; every metric,
event and attribute name is one the telemetry module defines or the guard emits, and the contract
names every one the code defines; PromQL uses real series, rules, labels and values; links
resolve. The conventions the documents keep to are in docs/design.md, "How the documents are
tested".
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider

import otel_guard.guard.telemetry as telemetry
from otel_guard import GuardSpanProcessor
from otel_guard.guard.mode import MODE_ENV_VAR
from otel_guard.integrations.producer import prompt_span
from otel_guard.reducer import RESET_REASONS

ROOT = Path(__file__).resolve().parent.parent
CONTRACT = ROOT / "docs" / "contract.md"
DOCUMENTS = (
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    ROOT / "collector-config" / "README.md",
)
RULES = ROOT / "collector-config" / "prometheus" / "rules.yml"
DASHBOARD = ROOT / "collector-config" / "grafana" / "otel-guard-shadow.json"

NOT_RUN = "<!-- not-run -->"
PRINTS = "<!-- prints -->"
# Labels every guard series carries from the resource (collector-config/README.md).
RESOURCE_LABELS = frozenset({"deployment_environment_name", "service_version"})

_FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>[\w-]*)\s*$")
_INLINE_CODE = re.compile(r"`([^`\n]+)`")
_COMMAND = re.compile(r"(?<![\w./-])otel-guard(?![\w./-])")
_FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")
_TELEMETRY_NAME = re.compile(r"acp\.repeated_tool_failure_guard\.[a-z_]+|acp\.loop_detected")
_SERIES = re.compile(r"acp_repeated_tool_failure_guard_[a-z_]+")
_RECORD = re.compile(r"otel_guard:[a-z0-9_:]+")
_ALERT = re.compile(r"\bOtelGuard[A-Za-z]+\b")
_MATCHER = re.compile(r"""([a-zA-Z_]\w*)\s*(=~|!~|!=|=)\s*"([^"]*)\"""")
_GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
_PANEL = re.compile(r'panel "([^"]+)"')
_LINK = re.compile(r"\]\(([^)\s]+)\)")


@dataclass(frozen=True)
class Block:
    """One fenced code block of a document."""

    path: Path
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    marker: str  # the line just before the fence, when it is an HTML comment

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


@dataclass(frozen=True)
class Document:
    path: Path
    text: str
    blocks: tuple[Block, ...]
    prose: str  # the text outside fenced blocks


def _parse(path: Path) -> Document:
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    prose: list[str] = []
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if fence is None:
            prose.append(lines[i])
            i += 1
            continue
        indent = len(fence["indent"])
        body: list[str] = []
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            line = lines[j]
            body.append(line[indent:] if not line[:indent].strip() else line.lstrip())
            j += 1
        if j == len(lines):
            pytest.fail(f"{path.relative_to(ROOT)}:{i + 1}: code block never closed")
        before = lines[i - 1].strip() if i > 0 else ""
        marker = before if before.startswith("<!--") else ""
        blocks.append(Block(path, i + 1, fence["lang"], "\n".join(body) + "\n", marker))
        i = j + 1
    return Document(path, "\n".join(lines), tuple(blocks), "\n".join(prose))


@cache
def documents() -> tuple[Document, ...]:
    return tuple(_parse(path) for path in DOCUMENTS)


def _python_examples() -> list[tuple[Block, str | None]]:
    """Python blocks to run, each with the output a following ``prints`` block promises."""
    examples: list[tuple[Block, str | None]] = []
    for document in documents():
        for block in document.blocks:
            if block.lang == "python" and block.marker != NOT_RUN:
                examples.append((block, None))
            elif block.marker == PRINTS:
                assert examples and examples[-1][0].path == block.path, (
                    f"{block.where}: a prints block must follow a Python block"
                )
                examples[-1] = (examples[-1][0], block.code)
    return examples


# --- Python examples run --------------------------------------------------------------------


class _Sink(BaseHTTPRequestHandler):
    """Accepts OTLP/HTTP exports and answers with an empty (successful) response."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def otlp_endpoint() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def _missing_modules(code: str) -> list[str]:
    """Modules the example imports that are not installed (optional extras).

    The package's own modules never count as missing: an example importing one that does not
    exist must fail, not skip.
    """
    names: set[str] = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return sorted(n for n in names if n.split(".")[0] != "otel_guard" and not _installed(n))


EXAMPLES = _python_examples()


@pytest.mark.parametrize(
    ("block", "expected"), EXAMPLES, ids=[block.where for block, _ in EXAMPLES]
)
def test_python_example_runs_as_a_script(
    block: Block, expected: str | None, otlp_endpoint: str
) -> None:
    missing = _missing_modules(block.code)
    if missing:
        pytest.skip(f"needs the optional module(s) {', '.join(missing)} (an extra not installed)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_") and k != MODE_ENV_VAR}
    env["OTEL_EXPORTER_OTLP_ENDPOINT"] = otlp_endpoint
    env["OTEL_EXPORTER_OTLP_PROTOCOL"] = "http/protobuf"
    result = subprocess.run(
        [sys.executable, "-c", block.code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, f"{block.where} failed:\n{result.stderr}"
    if expected is not None:
        assert result.stdout == expected, f"{block.where} printed something else"


def _rollout_gate() -> Block:
    """The runbook's gate script: the Python block of docs/rollout.md that runs the replay."""
    (gate,) = [
        block
        for block, _ in EXAMPLES
        if block.path.name == "rollout.md" and 'report["verdict"]' in block.code
    ]
    return gate


def _run_gate(*files: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_") and k != MODE_ENV_VAR}
    return subprocess.run(
        [sys.executable, "-c", _rollout_gate().code, *files],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_runbooks_gate_passes_on_good_traces() -> None:
    result = _run_gate("examples/demo-traces.jsonl")
    assert (result.returncode, result.stderr) == (0, "")
    assert "gate: pass" in result.stdout and "review: prompt-loop trace " in result.stdout


def test_the_runbooks_gate_fails_without_a_traceback_on_bad_inputs(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    broken = tmp_path / "broken.jsonl"
    demo = (ROOT / "examples" / "demo-traces.jsonl").read_text(encoding="utf-8").splitlines()
    broken.write_text(demo[0] + "\n{not json\n", encoding="utf-8")
    plain = tmp_path / "plain.jsonl"
    plain.write_text(
        '{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "'
        + "1" * 32
        + '", "spanId": "'
        + "2" * 16
        + '", "name": "GET /", "startTimeUnixNano": "1", "endTimeUnixNano": "2"}]}]}]}\n',
        encoding="utf-8",
    )
    cases = {
        str(tmp_path / "missing.jsonl"): (1, "cannot read (No such file or directory)"),
        str(empty): (3, "no spans read"),
        str(broken): (1, f"{broken}:2: invalid JSON"),
        str(plain): (4, "no prompt the guard can read"),
    }
    for path, (status, said) in cases.items():
        result = _run_gate(path)
        assert result.returncode == status, (path, result.stderr)
        assert said in result.stderr and "Traceback" not in result.stderr, result.stderr
        assert "gate: FAIL: " in result.stdout


def test_the_readme_shows_a_registration_example_with_its_output() -> None:
    readme = [block for block, expected in EXAMPLES if block.path.name == "README.md"]
    assert readme, "the README has no runnable Python example"
    assert any(expected for block, expected in EXAMPLES if block is readme[0])


# --- the command line ----------------------------------------------------------------------


def _help(*args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "otel_guard", *args, "--help"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return result.stdout


@cache
def cli_flags() -> dict[str, frozenset[str]]:
    """Flags by subcommand, from the real help output; key ``""`` is the command itself."""
    top = _help()
    commands = re.search(r"positional arguments:\n(.*?)\n\n", top, flags=re.S)
    assert commands is not None, top
    names = re.findall(r"^ {4}([a-z][a-z-]*) {2,}", commands.group(1), flags=re.M)
    assert names, top
    flags = {"": frozenset(_FLAG.findall(top))}
    for name in names:
        flags[name] = frozenset(_FLAG.findall(_help(name)))
    return flags


def _command_lines(document: Document) -> Iterator[tuple[str, str]]:
    """(where, text after ``otel-guard``) for every command line in code."""
    snippets = [(f"{document.path.name} (inline)", m) for m in _INLINE_CODE.findall(document.prose)]
    for block in document.blocks:
        if block.lang != "python":
            snippets.extend((block.where, line) for line in block.code.splitlines())
    for where, snippet in snippets:
        for match in _COMMAND.finditer(snippet):
            rest = re.split(r"\s(?:\||;|&&|>|#)\s?|\s#", snippet[match.end() :] + " ")[0]
            yield where, rest


def test_every_otel_guard_command_line_uses_real_subcommands_and_flags() -> None:
    flags = cli_flags()
    wrong: list[str] = []
    checked = 0
    for document in documents():
        for where, rest in _command_lines(document):
            checked += 1
            words = [w.strip("[]") for w in rest.split()]
            command = next((w for w in words if not w.startswith("-")), None)
            if command is not None and re.fullmatch(r"[a-z]+", command):
                if command not in flags:
                    wrong.append(f"{where}: no subcommand {command!r} in `otel-guard {rest}`")
                    continue
            else:
                command = ""
            known = flags[command] | flags[""]
            wrong.extend(
                f"{where}: `otel-guard {rest.strip()}`: {flag} is not in its --help"
                for flag in _FLAG.findall(rest)
                if flag not in known
            )
    assert checked > 0
    assert not wrong, "\n".join(wrong)


def test_every_flag_named_alone_belongs_to_a_subcommand() -> None:
    every = frozenset().union(*cli_flags().values())
    named = [
        (document.path.name, code.split()[0])
        for document in documents()
        for code in _INLINE_CODE.findall(document.prose)
        if _FLAG.match(code)
    ]
    assert named
    assert not [f"{where}: `{flag}`" for where, flag in named if flag not in every]


def _runnable_commands() -> list[tuple[str, list[str]]]:
    """Shell-block ``otel-guard`` commands whose every file argument is in the repository."""
    commands: list[tuple[str, list[str]]] = []
    for document in documents():
        for block in document.blocks:
            if block.lang != "sh":
                continue
            for line in block.code.splitlines():
                words = re.split(r"\s(?:>|#|\|)", line + " ")[0].split()
                if words[:1] != ["otel-guard"]:
                    continue
                files = [w for w in words[2:] if not w.startswith("-") and "/" in w]
                if files and all((ROOT / f).is_file() for f in files):
                    commands.append((block.where, words[1:]))
    return commands


COMMANDS = _runnable_commands()


@pytest.mark.parametrize(
    ("where", "args"), COMMANDS, ids=[f"{w} {' '.join(a)}" for w, a in COMMANDS]
)
def test_documented_command_on_files_of_the_repository_succeeds(
    where: str, args: list[str]
) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "otel_guard", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, f"{where}: otel-guard {' '.join(args)}\n{result.stderr}"
    assert result.stdout


# --- telemetry names -----------------------------------------------------------------------


@cache
def emitted() -> tuple[frozenset[str], frozenset[str], frozenset[str]]:
    """Metric names, event names and attribute keys a real guard emits on a loop it stops."""
    metrics = InMemoryMetricReader()
    logs = InMemoryLogRecordExporter()
    logger_provider = LoggerProvider()
    logger_provider.add_log_record_processor(SimpleLogRecordProcessor(logs))
    meter_provider = MeterProvider(metric_readers=[metrics])
    guard = GuardSpanProcessor(
        mode="enforce", meter_provider=meter_provider, logger_provider=logger_provider
    )
    GuardSpanProcessor(mode="sometimes", meter_provider=meter_provider)  # invalid_mode
    provider = TracerProvider()
    provider.add_span_processor(guard)
    tracer = provider.get_tracer("docs")
    with prompt_span(tracer, "docs-prompt") as prompt:
        for turn in range(4):
            with prompt.batch() as batch:
                for i in range(4):
                    call = batch.start_call(f"call-{turn}-{i}", "run_shell")
                    if turn == 0 and i == 0:
                        call.settle("cancelled")  # a reset first
                    else:
                        call.settle("error", "exit_nonzero")
                    call.finish()
                batch.record_input_drain()
            guard.take_action("docs-prompt")
    data = metrics.get_metrics_data()
    metric_names: set[str] = set()
    keys: set[str] = set()
    assert data is not None
    for resource_metrics in data.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                metric_names.add(metric.name)
                for point in metric.data.data_points:
                    keys.update(point.attributes or {})
    events: set[str] = set()
    for record in logs.get_finished_logs():
        log_record = record.log_record
        if log_record.event_name:
            events.add(log_record.event_name)
        keys.update(log_record.attributes or {})
    assert telemetry.LOOP_EVENT in events, "the harvest run never stopped the loop"
    return frozenset(metric_names), frozenset(events), frozenset(keys)


def _constants() -> dict[str, str]:
    return {
        name: value
        for name, value in vars(telemetry).items()
        if name.isupper() and isinstance(value, str)
    }


@cache
def known_names() -> frozenset[str]:
    metric_names, events, keys = emitted()
    values = set().union(*telemetry.METRIC_ATTRIBUTE_VALUES.values())
    return frozenset(
        {*_constants().values(), *telemetry.METRIC_ATTRIBUTE_VALUES, *values}
        | metric_names
        | events
        | keys
    )


def _metric_names() -> frozenset[str]:
    constants = {v for k, v in _constants().items() if k.endswith("_METRIC")}
    return frozenset(constants | emitted()[0])


def test_every_dotted_telemetry_name_in_the_docs_exists() -> None:
    known = known_names()
    wrong = [
        f"{document.path.name}: {name}"
        for document in documents()
        for name in _TELEMETRY_NAME.findall(document.text)
        if name not in known
    ]
    assert not wrong, "\n".join(wrong)


def test_every_prometheus_series_in_the_docs_is_a_guard_counter() -> None:
    series = {name.replace(".", "_") + "_total" for name in _metric_names()}
    wrong = [
        f"{document.path.name}: {name}"
        for document in documents()
        for name in _SERIES.findall(document.text)
        if name not in series
    ]
    assert not wrong, "\n".join(wrong)


def _tables(document: Document) -> Iterator[tuple[list[str], list[list[str]]]]:
    """(header cells, body rows) of each Markdown table outside code blocks."""
    rows: list[list[str]] = []
    for line in [*document.prose.splitlines(), ""]:
        if line.lstrip().startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
            continue
        if len(rows) >= 2:
            yield rows[0], rows[2:]
        rows = []


def test_every_attribute_key_in_a_telemetry_table_exists() -> None:
    known = known_names()
    wrong: list[str] = []
    checked = 0
    for document in documents():
        for header, rows in _tables(document):
            columns = [i for i, name in enumerate(header) if name in ("key", "attributes")]
            for row in rows:
                for i in columns:
                    for token in re.findall(r"`([^`]+)`", row[i] if i < len(row) else ""):
                        checked += 1
                        if token not in known:
                            wrong.append(f"{document.path.name}: {token!r} in {row}")
    assert checked > 0
    assert not wrong, "\n".join(wrong)


def test_every_value_in_a_key_values_table_is_in_its_closed_set() -> None:
    closed = telemetry.METRIC_ATTRIBUTE_VALUES
    wrong: list[str] = []
    checked = 0
    for document in documents():
        for header, rows in _tables(document):
            if header[:2] != ["key", "values"]:
                continue
            for row in rows:
                keys = re.findall(r"`([^`]+)`", row[0])
                if not keys or not all(key in closed for key in keys):
                    continue  # log-only keys hold open values (prompt IDs, ordinals)
                allowed = set().union(*(closed[key] for key in keys))
                for value in re.findall(r"`([^`]+)`", re.sub(r"\([^)]*\)", "", row[1])):
                    checked += 1
                    if value not in allowed:
                        wrong.append(f"{document.path.name}: {value!r} for {keys}")
    assert checked > 0
    assert not wrong, "\n".join(wrong)


def test_the_contract_names_everything_the_telemetry_module_defines() -> None:
    contract = set(re.findall(r"`([^`\n]+)`", CONTRACT.read_text(encoding="utf-8")))
    defined = {
        *(v for k, v in _constants().items() if k.endswith(("_METRIC", "_EVENT"))),
        *emitted()[0],
        *emitted()[1],
        *telemetry.METRIC_ATTRIBUTE_VALUES,
        *telemetry.DECISION_VALUES,
        *telemetry.DIAGNOSTICS,
        *RESET_REASONS,
        telemetry.SCOPE_NAME,
        telemetry.LOOP_TYPE,
        telemetry.ROUTE,
    }
    missing = sorted(defined - contract)
    assert not missing, f"docs/contract.md does not name {missing}"


# --- Prometheus and Grafana ----------------------------------------------------------------


@cache
def rules() -> tuple[frozenset[str], frozenset[str]]:
    """(recording rule names, alert names) of rules.yml."""
    records: set[str] = set()
    alerts: set[str] = set()
    yaml = pytest.importorskip("yaml", reason="rules are read with PyYAML ('test' extra)")
    for group in yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]:
        for rule in group["rules"]:
            if "record" in rule:
                records.add(rule["record"])
            else:
                alerts.add(rule["alert"])
    return frozenset(records), frozenset(alerts)


def test_every_recording_rule_and_alert_in_the_docs_exists() -> None:
    records, alerts = rules()
    wrong = [
        f"{document.path.name}: {name}"
        for document in documents()
        for name in [*_RECORD.findall(document.text), *_ALERT.findall(document.text)]
        if name not in records | alerts
    ]
    assert not wrong, "\n".join(wrong)


def _promql_blocks() -> list[Block]:
    return [b for d in documents() for b in d.blocks if b.lang == "promql"]


def test_promql_uses_only_the_guards_labels_and_values() -> None:
    labels = RESOURCE_LABELS | set(telemetry.METRIC_ATTRIBUTE_VALUES)
    closed = telemetry.METRIC_ATTRIBUTE_VALUES
    wrong: list[str] = []
    blocks = _promql_blocks()
    assert blocks, "no PromQL in the docs"
    for block in blocks:
        for label, op, value in _MATCHER.findall(block.code):
            if label not in labels:
                wrong.append(f"{block.where}: label {label}")
            elif label in closed:
                alternatives = value.split("|") if op in ("=~", "!~") else [value]
                wrong.extend(
                    f"{block.where}: {label}{op}{value!r}"
                    for v in alternatives
                    if v not in closed[label]
                )
        for grouping in _GROUPING.findall(block.code):
            wrong.extend(
                f"{block.where}: grouping label {name}"
                for name in (n.strip() for n in grouping.split(","))
                if name and name not in labels
            )
    assert not wrong, "\n".join(wrong)


def test_promql_in_the_docs_parses(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed")
    blocks = _promql_blocks()
    rules_file = tmp_path / "docs.rules.yml"
    lines = ["groups:", "  - name: docs", "    rules:"]
    for i, block in enumerate(blocks):
        lines += [
            f"      - record: docs:query_{i}:check",
            f"        expr: {json.dumps(block.code)}",
        ]
    rules_file.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = subprocess.run(
        [promtool, "check", "rules", str(rules_file)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_dashboard_panel_named_in_the_docs_exists() -> None:
    def titles(panels: list[dict[str, object]]) -> Iterator[str]:
        for panel in panels:
            yield str(panel.get("title", ""))
            yield from titles(panel.get("panels", []))  # type: ignore[arg-type]

    known = set(titles(json.loads(DASHBOARD.read_text(encoding="utf-8"))["panels"]))
    named = [(d.path.name, t) for d in documents() for t in _PANEL.findall(d.prose)]
    assert named
    assert not [f"{where}: {title}" for where, title in named if title not in known]


# --- no documents outside the repository ---

# Built from parts so that this file does not match itself.
# The contract's old name in capitals (a variable called spec is no reference), and the design
# document in any case.
_OUTSIDE = re.compile(r"\b" + "SP" + r"EC\b|(?i:" + "design" + " document)")


def test_nothing_refers_to_documents_outside_the_repository() -> None:
    files = [
        *DOCUMENTS,
        *ROOT.glob("otel_guard/**/*.py"),
        *ROOT.glob("tests/**/*.py"),
        *ROOT.glob("benchmarks/**/*"),
        *ROOT.glob("collector-config/**/*"),
    ]
    wrong = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in files
        if path.is_file() and path.suffix in (".py", ".md", ".yml", ".yaml", ".json")
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if _OUTSIDE.search(line)
    ]
    assert not wrong, "refer to docs/contract.md or docs/design.md instead:\n" + "\n".join(wrong)


# --- links ---------------------------------------------------------------------------------


def _anchor(heading: str) -> str:
    """The anchor a Markdown renderer gives a heading: lower case, punctuation dropped."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_every_relative_link_and_anchor_resolves() -> None:
    wrong: list[str] = []
    for document in documents():
        for target in _LINK.findall(document.prose):
            if re.match(r"[a-z]+:", target):
                continue
            file_part, _, anchor = target.partition("#")
            path = (document.path.parent / file_part).resolve() if file_part else document.path
            if not path.exists():
                wrong.append(f"{document.path.name}: {target} (no such file)")
                continue
            if anchor and path.suffix == ".md":
                headings = re.findall(r"^#+ (.+)$", _parse(path).prose, flags=re.M)
                if anchor not in {_anchor(h) for h in headings}:
                    wrong.append(f"{document.path.name}: {target} (no such heading)")
    assert not wrong, "\n".join(wrong)
