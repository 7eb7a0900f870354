"""The replay report groups by either environment key, as the Prometheus rules and dashboard do."""

from __future__ import annotations

from opentelemetry.sdk.resources import Resource

from otel_guard.replay.replayer import group_of


def test_the_newer_environment_key_groups_the_report() -> None:
    resource = Resource({"deployment.environment.name": "prod", "service.version": "2.0.0"})
    assert group_of(resource) == ("prod", "2.0.0")


def test_a_host_with_only_the_older_key_is_grouped_by_it() -> None:
    resource = Resource({"deployment.environment": "legacy", "service.version": "1.0.0"})
    assert group_of(resource) == ("legacy", "1.0.0")


def test_where_both_keys_are_set_the_newer_one_wins() -> None:
    resource = Resource(
        {"deployment.environment.name": "prod", "deployment.environment": "old-name"}
    )
    assert group_of(resource) == ("prod", None)


def test_a_host_with_neither_key_has_no_environment() -> None:
    assert group_of(Resource({"service.version": "1.0.0"})) == (None, "1.0.0")
