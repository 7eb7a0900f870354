"""The SDK's private span fields the hot path reads are still there, with the meaning assumed."""

from __future__ import annotations

from operator import attrgetter

from harness import Harness

from otel_guard.guard import _sdkfields


def test_every_private_field_agrees_with_its_public_property() -> None:
    # Fails on an SDK release that renames or retypes a field: the guard would still be right,
    # through the public properties, but several times slower on every span of the host.
    assert _sdkfields.check() == []


def test_a_renamed_field_is_reported() -> None:
    problems = _sdkfields.check(
        {
            "attribute_dict": attrgetter("_attributes._entries"),
            "end_time": attrgetter("_start_time"),
        }
    )
    assert [p.split(":")[0] for p in problems] == ["attribute_dict", "end_time"]


def test_spans_without_the_private_fields_take_the_public_path() -> None:
    h = Harness(mode="shadow")
    span = h.tracer.start_span("x", attributes={"acp.prompt.id": "p"})
    span.end()

    class Public:
        def __init__(self) -> None:
            self.attributes = {"acp.prompt.id": "p"}

    assert _sdkfields.attributes(span) == {"acp.prompt.id": "p"}
    assert _sdkfields.attributes(Public()) == {"acp.prompt.id": "p"}  # type: ignore[arg-type]
