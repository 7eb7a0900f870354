"""Keyed tool-name pseudonyms: the key's sources, the format, and what each key allows."""

from __future__ import annotations

import hashlib
import hmac
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_guard import RedactingSpanExporter, install_guard
from otel_guard.privacy.pseudonym import PSEUDONYM_KEY_ENV, Pseudonymizer


@pytest.fixture(autouse=True)
def no_key_in_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PSEUDONYM_KEY_ENV, raising=False)


def test_a_pseudonym_is_a_prefix_and_16_hex_digits_of_hmac_sha256() -> None:
    expected = hmac.new(b"deployment key", b"run_shell", hashlib.sha256).hexdigest()[:16]
    assert Pseudonymizer(b"deployment key")("run_shell") == "tool_" + expected
    assert Pseudonymizer("deployment key")("run_shell") == "tool_" + expected  # text is UTF-8
    assert Pseudonymizer(b"deployment key")("run_shell", "mcp_") == "mcp_" + expected


@given(st.text(), st.text())
def test_equal_names_stay_equal_and_different_names_stay_different(a: str, b: str) -> None:
    pseudonym = Pseudonymizer(b"k")
    assert (pseudonym(a) == pseudonym(b)) == (a == b)
    assert pseudonym(a) == pseudonym(a)


def test_the_environment_key_is_used_when_no_argument_is_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(PSEUDONYM_KEY_ENV, "from the environment")
    from_env = Pseudonymizer()
    assert from_env.from_deployment
    assert from_env("run_shell") == Pseudonymizer(b"from the environment")("run_shell")
    assert Pseudonymizer(b"argument wins")("run_shell") != from_env("run_shell")


def test_without_a_key_each_process_has_its_own_random_key() -> None:
    # One process: every pseudonymizer agrees, so a process's traces replay exactly.
    assert not Pseudonymizer().from_deployment
    assert Pseudonymizer()("run_shell") == Pseudonymizer()("run_shell")
    assert Pseudonymizer(b"")("run_shell") == Pseudonymizer()("run_shell")
    # Another process: another key, so nothing correlates across processes.
    script = (
        "from otel_guard.privacy.pseudonym import Pseudonymizer; "
        "print(Pseudonymizer()('run_shell'))"
    )
    others = {
        subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
        ).stdout.strip()
        for _ in range(2)
    }
    assert len(others) == 2
    assert Pseudonymizer()("run_shell") not in others


def test_a_deployment_key_gives_the_same_pseudonym_in_every_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(PSEUDONYM_KEY_ENV, "fleet key")
    script = (
        "from otel_guard.privacy.pseudonym import Pseudonymizer; "
        "print(Pseudonymizer()('run_shell'))"
    )
    other = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    ).stdout.strip()
    assert other == Pseudonymizer()("run_shell") == Pseudonymizer(b"fleet key")("run_shell")


def test_the_exporter_and_install_guard_take_the_key() -> None:
    out = InMemorySpanExporter()
    span = ReadableSpan("execute_tool run_shell", attributes={"gen_ai.tool.name": "run_shell"})
    RedactingSpanExporter(out, pseudonym_key=b"k").export([span])
    RedactingSpanExporter(out).export([span])
    keyed, unkeyed = ((s.attributes or {})["gen_ai.tool.name"] for s in out.get_finished_spans())
    assert keyed == Pseudonymizer(b"k")("run_shell")
    assert unkeyed == Pseudonymizer()("run_shell") != keyed
    otel = install_guard(pseudonym_key=b"k", set_global=False)
    try:
        assert otel.span_exporter.redact(span).attributes == {"gen_ai.tool.name": keyed}
    finally:
        otel.shutdown()


def test_a_name_with_a_lone_surrogate_has_a_pseudonym_of_its_code_units() -> None:
    name = "run\ud800shell"  # as a JSON trace may carry it
    expected = hmac.new(b"k", name.encode("utf-8", "surrogatepass"), hashlib.sha256)
    assert Pseudonymizer(b"k")(name) == "tool_" + expected.hexdigest()[:16]
    assert Pseudonymizer(b"k")(name) != Pseudonymizer(b"k")("run\udfffshell")


def test_an_environment_key_that_is_not_utf8_keys_with_the_bytes_the_operator_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Undecodable bytes of the environment reach Python as lone surrogates ("\udcff" for 0xff).
    monkeypatch.setenv(PSEUDONYM_KEY_ENV, "k\udcff")
    pseudonymizer = Pseudonymizer()
    assert pseudonymizer.from_deployment
    digest = hmac.new(b"k\xff", b"run_shell", hashlib.sha256).hexdigest()[:16]
    assert pseudonymizer("run_shell") == "tool_" + digest


def test_a_key_argument_with_a_lone_surrogate_is_still_a_key() -> None:
    assert Pseudonymizer("k\ud800")("run_shell") == Pseudonymizer("k\ud800")("run_shell")


@pytest.mark.parametrize("key", [123, 1.5, ["secret"]])
def test_a_key_argument_of_another_type_raises_naming_the_argument(key: object) -> None:
    with pytest.raises(TypeError, match="pseudonym_key"):
        Pseudonymizer(key)  # type: ignore[arg-type]  # a host's untyped configuration
