"""The otelcol-guard distribution, run by tests: where its binary is, and collectors on 127.0.0.1.

The binary is ``$OTEL_GUARD_COLLECTOR_BIN`` when set, else ``collector/_build/otelcol-guard``
(what ``collector/build.sh`` builds). Tests skip without it, unless
``OTEL_GUARD_COLLECTOR_REQUIRED`` is set (``.ci/run`` sets it after building): then a missing
binary, or one without the guard connector, fails them.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
BINARY_ENV = "OTEL_GUARD_COLLECTOR_BIN"
REQUIRED_ENV = "OTEL_GUARD_COLLECTOR_REQUIRED"
DEFAULT_BINARY = ROOT / "collector" / "_build" / "otelcol-guard"
CONNECTOR_TYPE = "repeated_tool_failure_guard"
DEADLINE_SECONDS = 60.0

_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _unavailable(reason: str) -> None:
    if os.environ.get(REQUIRED_ENV):
        pytest.fail(f"{reason} ({REQUIRED_ENV} is set: the distribution must be there)")
    pytest.skip(f"{reason}; build it with collector/build.sh")


def collector_binary() -> Path:
    """The distribution's binary, or a skip (a failure where it is required)."""
    binary = Path(os.environ.get(BINARY_ENV) or DEFAULT_BINARY)
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        _unavailable(f"no otelcol-guard binary at {binary}")
    return binary


def components(binary: Path) -> dict[str, Any]:
    """What the binary was built with (``otelcol-guard components``)."""
    import yaml

    out = subprocess.run(
        [str(binary), "components"], capture_output=True, check=True, timeout=60
    ).stdout
    listed: dict[str, Any] = yaml.safe_load(out)
    return listed


def guard_binary() -> Path:
    """The distribution's binary with the guard connector in it, or a skip (or failure)."""
    binary = collector_binary()
    names = {entry["name"] for entry in components(binary).get("connectors") or []}
    if CONNECTOR_TYPE not in names:
        _unavailable(f"{binary} has no {CONNECTOR_TYPE} connector")
    return binary


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_for(what: str, check: Callable[[], bool], detail: Callable[[], str] = str) -> None:
    """Polls ``check`` until it holds, or fails after the deadline with ``detail()``."""
    deadline = time.monotonic() + DEADLINE_SECONDS
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {DEADLINE_SECONDS:.0f}s waiting for {what}\n{detail()}")


def http_ok(url: str) -> bool:
    try:
        with _NO_PROXY.open(url, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def post(url: str, body: bytes, content_type: str) -> int:
    request = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": content_type}
    )
    with _NO_PROXY.open(request, timeout=30) as response:
        return int(response.status)


class Collector:
    """One collector process, started on a configuration, ready once health_check answers."""

    def __init__(
        self,
        binary: Path,
        configs: list[Path],
        workdir: Path,
        health_port: int,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.workdir = workdir
        self.log = workdir / f"collector-{health_port}.log"
        command = [str(binary)] + [f"--config={config}" for config in configs]
        with self.log.open("wb") as sink:
            self.process = subprocess.Popen(
                command,
                stdout=sink,
                stderr=subprocess.STDOUT,
                cwd=workdir,
                env={**os.environ, **(env or {})},
            )
        self.health = f"http://127.0.0.1:{health_port}/"
        try:
            wait_for(
                f"the collector on {configs} to be healthy",
                lambda: self.process.poll() is not None or http_ok(self.health),
                self.log_tail,
            )
            if self.process.poll() is not None:
                raise AssertionError(f"the collector exited:\n{self.log_tail()}")
        except BaseException:
            self.stop()
            raise

    def log_tail(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")[-4000:]

    def stop(self) -> None:
        """Stops the process (SIGTERM: the collector drains its pipelines), then kills it."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)


def write_config(path: Path, config: Mapping[str, Any]) -> Path:
    # JSON is YAML: the collector reads it as its configuration.
    path.write_text(json.dumps(config, indent=1), encoding="utf-8")
    return path


def health_extension(port: int) -> dict[str, Any]:
    return {"health_check": {"endpoint": f"127.0.0.1:{port}"}}


def json_lines(path: Path) -> Iterator[dict[str, Any]]:
    """The file exporter's JSON lines written so far (a half-written last line is left out)."""
    if not path.exists():
        return
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except json.JSONDecodeError:
            return
