"""The guard attached to a real pydantic-ai Agent, driven offline by a FunctionModel."""

from __future__ import annotations

import asyncio
import json
import re
import warnings
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "pydantic_ai", reason="the pydantic-ai integration needs the 'pydantic-ai' extra installed"
)

from contract_spans import contract_spans
from harness import Harness
from pydantic_ai import Agent, ModelRetry, RunContext
from pydantic_ai.exceptions import RunCancelled, UnexpectedModelBehavior
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    SystemPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, FunctionModel
from pydantic_ai.profiles import ModelProfile

from otel_guard import BatchEvaluation
from otel_guard.guard.telemetry import DECISIONS_METRIC
from otel_guard.integrations.pydantic_ai import (
    RepeatedToolFailureGuard,
    RepeatedToolFailureReminderPart,
    RepeatedToolFailureStopped,
)
from otel_guard.reducer import REMINDER, STOP_MESSAGE, Batch

TOOL_RETRIES = 5  # pydantic-ai's own limit for the failing tool: one retry per model step


def _parts(message: ModelMessage) -> list[Any]:
    return list(message.parts)


def _has_reminder(message: ModelMessage) -> bool:
    return any(REMINDER in str(getattr(part, "content", "")) for part in _parts(message))


@dataclass
class ScriptedModel:
    """A FunctionModel script: ``respond(step, last_request)`` gives the response parts."""

    respond: Callable[[int, ModelMessage], list[Any]]
    requests: list[ModelMessage] = field(default_factory=list)

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.requests.append(messages[-1])
        return ModelResponse(parts=self.respond(len(self.requests), messages[-1]))

    def reminders(self) -> int:
        return sum(_has_reminder(request) for request in self.requests)


def always_failing(width: int = 4) -> Callable[[int, ModelMessage], list[Any]]:
    """A model that keeps calling the failing tool, ``width`` calls per response."""

    def respond(step: int, last: ModelMessage) -> list[Any]:
        return [
            ToolCallPart("run_shell", {"command": "make"}, tool_call_id=f"s{step}-c{i}")
            for i in range(width)
        ]

    return respond


def build_agent(
    model: ScriptedModel, guard: RepeatedToolFailureGuard | None, *others: Any
) -> Agent[None, str]:
    agent = Agent(FunctionModel(model), capabilities=[*others, *([] if guard is None else [guard])])

    @agent.tool_plain(retries=TOOL_RETRIES)
    def run_shell(command: str) -> str:
        if command == "make":
            raise ModelRetry("make: *** [all] Error 2")
        return "built"

    @agent.tool_plain(retries=TOOL_RETRIES)
    def read_file(path: str) -> str:
        return "contents"

    @agent.tool_plain(retries=TOOL_RETRIES)
    def count(n: int) -> int:
        return n

    return agent


class Setup:
    """A harness whose guard watches a guarded agent, with every evaluated batch recorded."""

    def __init__(self, mode: str, **guard_kwargs: Any) -> None:
        self.evaluations: list[BatchEvaluation] = []
        self.harness = Harness(mode=mode, listener=self.evaluations.append)
        self.capability = RepeatedToolFailureGuard(
            self.harness.guard, tracer_provider=self.harness.tracer_provider, **guard_kwargs
        )

    def agent(self, model: ScriptedModel) -> Agent[None, str]:
        return build_agent(model, self.capability)

    def decisions(self) -> dict[str, int]:
        return self.harness.decision_counts()

    def reset_reasons(self) -> dict[str, int]:
        return {
            str(a["reset_reason"]): v
            for a, v in self.harness.points(DECISIONS_METRIC)
            if a["decision"] == "reset"
        }


def test_shadow_runs_to_pydantic_ais_own_limit_recording_would_warn_and_would_stop() -> None:
    setup = Setup("shadow")
    model = ScriptedModel(always_failing())
    with pytest.raises(UnexpectedModelBehavior, match="exceeded max retries count of 5"):
        setup.agent(model).run_sync("build it")
    assert len(model.requests) == TOOL_RETRIES + 1
    assert model.reminders() == 0
    assert setup.decisions() == {"tracked": 1, "would_warn": 1, "would_stop": 1}
    assert [e.decision.kind for e in setup.evaluations[:3]] == [
        "tracked",
        "would_warn",
        "would_stop",
    ]
    assert all(e.action is None for e in setup.evaluations)


def _spans(setup: Setup, name: str) -> list[Any]:
    return [s for s in setup.harness.span_exporter.get_finished_spans() if s.name == name]


def _transcript(messages: list[ModelMessage]) -> list[tuple[str, str]]:
    return [(type(p).__name__, str(getattr(p, "content", ""))) for m in messages for p in _parts(m)]


def test_shadow_leaves_the_run_exactly_as_without_the_guard() -> None:
    outcomes = []
    for guard in (None, Setup("shadow").capability):
        model = ScriptedModel(always_failing())
        with pytest.raises(UnexpectedModelBehavior) as raised:
            build_agent(model, guard).run_sync("build it")
        outcomes.append((_transcript(model.requests), str(raised.value)))
    assert outcomes[0] == outcomes[1]
    assert len(outcomes[0][0]) == 1 + 4 * TOOL_RETRIES


def test_enforce_stops_after_exactly_one_reminder_and_the_next_failing_batch() -> None:
    setup = Setup("enforce")
    model = ScriptedModel(always_failing())
    with pytest.raises(RepeatedToolFailureStopped) as raised:
        setup.agent(model).run_sync("build it")
    assert len(model.requests) == 3
    assert [_has_reminder(r) for r in model.requests] == [False, False, True]
    stopped = raised.value
    assert stopped.message == STOP_MESSAGE and str(stopped) == STOP_MESSAGE
    assert setup.decisions() == {"tracked": 1, "warned": 1, "stopped": 1}
    assert len(setup.harness.logs("acp.loop_detected")) == 1
    # The stop keeps the settled batch's results, then the stop text, in the history.
    last = stopped.messages[-1]
    assert isinstance(last, ModelRequest)
    *returns, stop_part = _parts(last)
    assert [r.tool_call_id for r in returns if isinstance(r, ToolReturnPart)] == [
        f"s3-c{i}" for i in range(4)
    ]
    assert isinstance(stop_part, SystemPromptPart) and stop_part.content == STOP_MESSAGE
    assert isinstance(stopped.messages[-2], ModelResponse)
    assert stopped.prompt_id == setup.evaluations[0].prompt_id


def test_warn_reminds_once_and_never_stops() -> None:
    setup = Setup("warn")
    model = ScriptedModel(always_failing())
    with pytest.raises(UnexpectedModelBehavior, match="exceeded max retries"):
        setup.agent(model).run_sync("build it")
    assert len(model.requests) == TOOL_RETRIES + 1
    assert [_has_reminder(r) for r in model.requests] == [False, False, True, False, False, False]
    assert setup.decisions() == {"tracked": 1, "warned": 1, "would_stop": 1}


def test_a_model_that_reads_the_reminder_and_changes_approach_is_not_stopped() -> None:
    def respond(step: int, last: ModelMessage) -> list[Any]:
        if _has_reminder(last):
            return [ToolCallPart("run_shell", {"command": "make -k"}, tool_call_id="fixed")]
        if any(isinstance(p, ToolReturnPart) and p.tool_call_id == "fixed" for p in _parts(last)):
            return [TextPart("built after changing approach")]
        return always_failing()(step, last)

    setup = Setup("enforce")
    model = ScriptedModel(respond)
    result = setup.agent(model).run_sync("build it")
    assert result.output == "built after changing approach"
    assert model.reminders() == 1
    assert setup.decisions() == {"tracked": 1, "warned": 1, "reset": 1}
    assert setup.reset_reasons() == {"success": 1}
    final = setup.evaluations[-1]
    assert (final.decision.kind, final.decision.reason) == ("reset", "success")
    assert final.decision.state.failure_count == 0 and final.decision.state.phase == "idle"


# -- the reminder's voice: what the model is sent, and what the history keeps ------------------

INLINE_SYSTEM = ModelProfile(supports_inline_system_prompts=True)


@dataclass
class SeenModel(ScriptedModel):
    """A script that keeps every whole message list the model was sent, as the model got it."""

    sent: list[list[ModelMessage]] = field(default_factory=list)

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.sent.append(list(messages))
        return super().__call__(messages, info)


def _reminder_parts(messages: list[ModelMessage]) -> list[Any]:
    return [
        part
        for message in messages
        if isinstance(message, ModelRequest)
        for part in _parts(message)
        if REMINDER in str(getattr(part, "content", ""))
    ]


def _guarded_run(mode: str, profile: ModelProfile | None) -> tuple[SeenModel, list[Any], Any]:
    """A failing run in ``mode`` on a model with ``profile``: the model, the warnings the run
    raised, and its outcome (the stop, or pydantic-ai's own retry limit)."""
    setup = Setup(mode)
    model = SeenModel(always_failing())
    agent = Agent(FunctionModel(model, profile=profile), capabilities=[setup.capability])

    @agent.tool_plain(retries=TOOL_RETRIES)
    def run_shell(command: str) -> str:
        raise ModelRetry("make: *** [all] Error 2")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises((RepeatedToolFailureStopped, UnexpectedModelBehavior)) as raised:
            agent.run_sync("build it")
    expected = {"warn": {"tracked": 1, "warned": 1, "would_stop": 1}}
    assert setup.decisions() == expected.get(mode, {"tracked": 1, "warned": 1, "stopped": 1})
    return model, list(caught), raised.value


@pytest.mark.parametrize("mode", ["warn", "enforce"])
def test_delivering_the_reminder_raises_no_warning(mode: str) -> None:
    _, caught, _ = _guarded_run(mode, None)
    assert [str(w.message) for w in caught if issubclass(w.category, UserWarning)] == []


@pytest.mark.parametrize("mode", ["warn", "enforce"])
@pytest.mark.parametrize(
    ("profile", "rendered"),
    [
        # A model API with mid-conversation system messages gets one.
        (INLINE_SYSTEM, (SystemPromptPart, REMINDER)),
        # One without gets pydantic-ai's system framing on the user channel.
        (None, (UserPromptPart, f"<system>{REMINDER}</system>")),
    ],
    ids=["inline-system", "system-framed"],
)
def test_the_model_is_sent_the_reminder_once_in_the_applications_voice(
    mode: str, profile: ModelProfile | None, rendered: tuple[type[Any], str]
) -> None:
    model, _, outcome = _guarded_run(mode, profile)
    requests = 3 if mode == "enforce" else TOOL_RETRIES + 1
    assert len(model.sent) == requests
    # Nothing before the failing batches settled; then the request after them carries it.
    assert [len(_reminder_parts(sent)) for sent in model.sent[:3]] == [0, 0, 1]
    (reminder,) = _reminder_parts([model.sent[2][-1]])
    assert (type(reminder), reminder.content) == rendered
    # Later requests carry it once more, where the history has it, never again anew.
    for sent in model.sent[3:]:
        assert _reminder_parts(sent) == [reminder]
        assert _reminder_parts([sent[-1]]) == []
    if mode == "enforce":  # reminded once, then stopped instead of a fourth request
        assert isinstance(outcome, RepeatedToolFailureStopped)
        stop = outcome.messages[-1].parts[-1]
        assert isinstance(stop, SystemPromptPart) and stop.content == STOP_MESSAGE


def test_the_history_keeps_the_reminder_as_the_guards_own_part() -> None:
    _, _, stopped = _guarded_run("enforce", None)
    assert isinstance(stopped, RepeatedToolFailureStopped)
    (reminder,) = _reminder_parts(stopped.messages)
    if RepeatedToolFailureReminderPart is None:  # a pydantic-ai without capability parts
        assert isinstance(reminder, SystemPromptPart) and reminder.content == REMINDER
        return
    assert isinstance(reminder, RepeatedToolFailureReminderPart)
    assert reminder.kind == "otel_guard.repeated_tool_failure_reminder"
    assert reminder.content == REMINDER and reminder.source.authority == "operator"
    # Saved and loaded again, the history still holds it by type.
    loaded = ModelMessagesTypeAdapter.validate_json(
        ModelMessagesTypeAdapter.dump_json(stopped.messages)
    )
    (again,) = _reminder_parts(loaded)
    assert isinstance(again, RepeatedToolFailureReminderPart) and again.content == REMINDER


def test_parallel_tool_calls_in_one_response_form_one_batch() -> None:
    def respond(step: int, last: ModelMessage) -> list[Any]:
        if step == 1:
            return [
                ToolCallPart("run_shell", {"command": "make"}, tool_call_id="a"),
                ToolCallPart("read_file", {"path": "Makefile"}, tool_call_id="b"),
                ToolCallPart("run_shell", {"command": "make"}, tool_call_id="c"),
            ]
        return [TextPart("done")]

    setup = Setup("shadow")
    setup.agent(ScriptedModel(respond)).run_sync("build it")
    (evaluation,) = setup.evaluations
    assert evaluation.batch.complete is True
    assert sorted(
        (o.call_id, o.policy_tool_name, o.execution_status, o.execution_error_type)
        for o in evaluation.batch.observations
    ) == [
        ("a", "run_shell", "error", "model_retry"),
        ("b", "read_file", "success", None),
        ("c", "run_shell", "error", "model_retry"),
    ]
    spans = setup.harness.span_exporter.get_finished_spans()
    (batch_span,) = [s for s in spans if s.name == "tool_batch"]
    assert batch_span.attributes is not None and batch_span.attributes["acp.batch.admitted"] == 3
    tools = [s for s in spans if s.name.startswith("execute_tool ")]
    assert len(tools) == 3
    assert batch_span.context is not None
    assert {s.parent.span_id for s in tools if s.parent} == {batch_span.context.span_id}


def test_a_validation_error_is_not_counted() -> None:
    def respond(step: int, last: ModelMessage) -> list[Any]:
        return [
            ToolCallPart("count", {"n": "many"}, tool_call_id=f"s{step}-c{i}") for i in range(4)
        ]

    setup = Setup("enforce")
    model = ScriptedModel(respond)
    with pytest.raises(UnexpectedModelBehavior, match="exceeded max retries"):
        setup.agent(model).run_sync("count")
    assert len(model.requests) == TOOL_RETRIES + 1
    assert setup.decisions() == {}
    observations = [o for e in setup.evaluations for o in e.batch.observations]
    # pydantic-ai's retry limit aborts the last batch after its first call: incomplete.
    assert len(observations) == 4 * TOOL_RETRIES + 1
    assert [e.batch.complete for e in setup.evaluations] == [True] * TOOL_RETRIES + [False]
    assert {(o.terminal_status, o.execution_status) for o in observations} == {
        ("error", "not_started")
    }


def test_a_validation_error_resets_a_streak() -> None:
    def respond(step: int, last: ModelMessage) -> list[Any]:
        if step == 2:
            return [ToolCallPart("count", {"n": "many"}, tool_call_id="bad")]
        if step == 3:
            return [TextPart("gave up")]
        return always_failing()(step, last)

    setup = Setup("shadow")
    setup.agent(ScriptedModel(respond)).run_sync("build it")
    assert setup.decisions() == {"tracked": 1, "reset": 1}
    assert setup.reset_reasons() == {"not_started": 1}


def test_an_unknown_tool_is_not_started() -> None:
    def respond(step: int, last: ModelMessage) -> list[Any]:
        if step == 1:
            return [ToolCallPart("deploy", {}, tool_call_id="x")]
        return [TextPart("done")]

    setup = Setup("shadow")
    setup.agent(ScriptedModel(respond)).run_sync("deploy")
    (evaluation,) = setup.evaluations
    assert evaluation.batch.complete is True
    (observation,) = evaluation.batch.observations
    assert (observation.policy_tool_name, observation.execution_status) == ("deploy", "not_started")


def test_a_raising_tool_is_an_execution_error_typed_from_its_exception_class() -> None:
    def respond(step: int, last: ModelMessage) -> list[Any]:
        return [ToolCallPart("open_config", {}, tool_call_id="o1")]

    setup = Setup("shadow")
    agent = setup.agent(ScriptedModel(respond))

    @agent.tool_plain
    def open_config() -> str:
        raise FileNotFoundError("/etc/agent.toml")

    with pytest.raises(FileNotFoundError):
        agent.run_sync("configure")
    (evaluation,) = setup.evaluations
    (observation,) = evaluation.batch.observations
    assert (observation.terminal_status, observation.execution_status) == ("error", "error")
    assert observation.execution_error_type == "file_not_found_error"
    assert evaluation.decision.kind == "tracked"


def test_cancellation_ends_the_call_cancelled_and_counts_nothing() -> None:
    def respond(step: int, last: ModelMessage) -> list[Any]:
        return [ToolCallPart("wait_for_approval", {}, tool_call_id="w1")]

    setup = Setup("shadow")
    agent = setup.agent(ScriptedModel(respond))

    @agent.tool
    async def wait_for_approval(ctx: RunContext[None]) -> str:
        ctx.cancel()
        await asyncio.sleep(0)
        return "approved"

    with pytest.raises(RunCancelled):
        agent.run_sync("deploy")
    (tool,) = _spans(setup, "execute_tool wait_for_approval")
    assert tool.attributes is not None
    assert tool.attributes["acp.tool.status"] == "cancelled"
    assert tool.attributes["acp.tool.execution.status"] == "cancelled"
    # The run tears the node down before the tool task sees its cancellation, so the call ends
    # after its batch: a late frame, and the guard resets on the incomplete batch.
    (evaluation,) = setup.evaluations
    assert evaluation.batch == Batch(complete=False, observations=())
    assert evaluation.decision.kind == "none" and evaluation.decision.state.failure_count == 0
    assert setup.harness.diagnostic_counts() == {"late_span": 1}


def test_a_call_id_repeated_within_one_response_is_flagged_a_duplicate() -> None:
    def respond(step: int, last: ModelMessage) -> list[Any]:
        return [
            ToolCallPart("read_file", {"path": "a"}, tool_call_id="same"),
            ToolCallPart("read_file", {"path": "a"}, tool_call_id="same"),
        ]

    setup = Setup("shadow")
    with pytest.raises(UnexpectedModelBehavior, match="unique `tool_call_id`"):
        setup.agent(ScriptedModel(respond)).run_sync("read")
    (evaluation,) = setup.evaluations
    assert evaluation.batch.complete is False  # pydantic-ai ran none of the calls
    assert [o.provider_duplicate for o in evaluation.batch.observations] == [True]


def test_a_call_id_reused_by_a_later_response_is_a_new_call() -> None:
    def respond(step: int, last: ModelMessage) -> list[Any]:
        if step <= 2:
            return [ToolCallPart("run_shell", {"command": "make"}, tool_call_id="call_0")]
        return [TextPart("done")]

    setup = Setup("shadow")
    setup.agent(ScriptedModel(respond)).run_sync("build it")
    assert [e.decision.state.failure_count for e in setup.evaluations] == [1, 2]
    assert not any(o.provider_duplicate for e in setup.evaluations for o in e.batch.observations)


def test_a_channel_prompt_is_never_guarded() -> None:
    setup = Setup("enforce", channel=True)
    model = ScriptedModel(always_failing())
    with pytest.raises(UnexpectedModelBehavior):
        setup.agent(model).run_sync("build it")
    assert model.reminders() == 0
    assert setup.decisions() == {}
    assert setup.evaluations == []


def test_each_run_is_a_fresh_prompt() -> None:
    setup = Setup("enforce")
    agent = setup.agent(ScriptedModel(always_failing()))
    for _ in range(2):
        with pytest.raises(RepeatedToolFailureStopped):
            agent.run_sync("build it")
    assert setup.decisions() == {"tracked": 2, "warned": 2, "stopped": 2}
    assert len({e.prompt_id for e in setup.evaluations}) == 2


def test_without_a_tracer_provider_the_guard_still_sees_every_batch() -> None:
    harness = Harness(mode="enforce")
    model = ScriptedModel(always_failing())
    with pytest.raises(RepeatedToolFailureStopped):
        build_agent(model, RepeatedToolFailureGuard(harness.guard)).run_sync("build it")
    assert harness.decision_counts() == {"tracked": 1, "warned": 1, "stopped": 1}
    assert harness.span_exporter.get_finished_spans() == ()


def test_documented_example_stops_after_three_responses(
    capsys: pytest.CaptureFixture[str],
) -> None:
    readme = Path(__file__).resolve().parent.parent / "docs" / "pydantic-ai.md"
    blocks = re.findall(r"```python\n(.*?)```", readme.read_text(encoding="utf-8"), flags=re.S)
    (example,) = [b for b in blocks if "RepeatedToolFailureGuard(guard)" in b]
    namespace: dict[str, Any] = {"__name__": "readme_example"}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(compile(example, str(readme), "exec"), namespace)
    assert capsys.readouterr().out.splitlines() == [STOP_MESSAGE]
    assert [str(w.message) for w in caught] == []  # nothing on stderr for a new user
    responses = [m for m in namespace["history"] if isinstance(m, ModelResponse)]
    assert len(responses) == 3


def test_an_unknown_route_is_rejected_when_the_capability_is_built() -> None:
    with pytest.raises(ValueError, match="route"):
        RepeatedToolFailureGuard(Harness().guard, route="nightly")


def test_user_input_queued_while_a_batch_ran_resets_the_streak() -> None:
    def respond(step: int, last: ModelMessage) -> list[Any]:
        if step == 2:
            return [ToolCallPart("ask_user", {}, tool_call_id="q")]
        if step == 3:
            return [TextPart("done")]
        return always_failing()(step, last)

    setup = Setup("shadow")
    agent = setup.agent(ScriptedModel(respond))

    @agent.tool
    def ask_user(ctx: RunContext[None]) -> str:
        ctx.enqueue("Try the release branch instead.")  # user content arriving mid-turn
        return "asked"

    agent.run_sync("build it")
    assert [e.has_external_input for e in setup.evaluations] == [False, True]
    assert setup.reset_reasons() == {"external_input": 1}


@pytest.mark.parametrize("at", ["CallToolsNode", "ModelRequestNode"])
def test_user_input_queued_between_batches_resets_the_streak_once(at: str) -> None:
    # Queued while a batch's node runs, it is that batch's input drain; queued at the request
    # that follows a settled batch, it reaches the model with that request, and the next batch
    # settles with it. Either way once, never twice.
    setup = Setup("shadow")
    agent = setup.agent(ScriptedModel(always_failing(width=2)))

    async def drive() -> None:
        with pytest.raises(UnexpectedModelBehavior):
            async with agent.iter("build it") as run:
                seen = 0
                async for node in run:
                    if type(node).__name__ == at:
                        seen += 1
                        if seen == 2:
                            run.enqueue(UserPromptPart("Try the release branch instead."))

    asyncio.run(drive())
    # (The run's end, at pydantic-ai's retry limit, may settle a last batch of its own way.)
    assert setup.reset_reasons().get("external_input") == 1
    assert sum(e.has_external_input for e in setup.evaluations) == 1


def _instrumented(setup_mode: str) -> tuple[Setup, Agent[None, str], ScriptedModel]:
    """The capability beside pydantic-ai's own Instrumentation, on one exporting provider."""
    from pydantic_ai.capabilities.instrumentation import Instrumentation
    from pydantic_ai.models.instrumented import InstrumentationSettings

    setup = Setup(setup_mode)
    settings = InstrumentationSettings(
        tracer_provider=setup.harness.tracer_provider, include_content=False
    )
    model = ScriptedModel(always_failing())
    return setup, build_agent(model, setup.capability, Instrumentation(settings=settings)), model


def test_with_pydantic_ais_instrumentation_each_tool_call_is_exported_once() -> None:
    setup, agent, model = _instrumented("shadow")
    with pytest.raises(UnexpectedModelBehavior):
        agent.run_sync("build it")
    spans = setup.harness.span_exporter.get_finished_spans()
    tools = [
        s for s in spans if (s.attributes or {}).get("gen_ai.operation.name") == "execute_tool"
    ]
    calls = 4 * len(model.requests)
    assert len(tools) == calls == 24
    assert len({(s.attributes or {})["gen_ai.tool.call.id"] for s in tools}) == calls
    assert not any(k.startswith("acp.") for s in spans for k in (s.attributes or {}))
    exported = {s.context.span_id for s in spans if s.context is not None}
    assert all(s.parent is None or s.parent.span_id in exported for s in spans)
    # Decided once, through the capability's batches; the GenAI reading of the run stepped aside.
    assert setup.decisions() == {"tracked": 1, "would_warn": 1, "would_stop": 1}
    assert {e.profile for e in setup.evaluations} == {"acp"}


def test_with_pydantic_ais_instrumentation_enforce_still_stops() -> None:
    setup, agent, model = _instrumented("enforce")
    with pytest.raises(RepeatedToolFailureStopped):
        agent.run_sync("build it")
    assert len(model.requests) == 3
    assert setup.decisions() == {"tracked": 1, "warned": 1, "stopped": 1}


# -- streaming runs: the same batches, reminder and stop as run() -------------------------------


def _streamed(model: ScriptedModel) -> Callable[[list[ModelMessage], AgentInfo], Any]:
    """The script's responses streamed part by part (text as text, calls as argument deltas)."""

    async def stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[Any]:
        model.requests.append(messages[-1])
        model.streamed += 1
        for index, part in enumerate(model.respond(len(model.requests), messages[-1])):
            if isinstance(part, TextPart):
                yield part.content
            else:
                delta = DeltaToolCall(
                    name=part.tool_name,
                    json_args=json.dumps(part.args),
                    tool_call_id=part.tool_call_id,
                )
                yield {index: delta}

    return stream


def failing_then_giving_up(step: int, last: ModelMessage) -> list[Any]:
    # Below pydantic-ai's retry limit: a run that hits it cancels sibling calls at random.
    return always_failing()(step, last) if step <= 4 else [TextPart("giving up")]


@dataclass
class StreamingModel(ScriptedModel):
    streamed: int = 0


def _streaming_agent(setup: Setup, model: StreamingModel, *others: Any) -> Agent[None, str]:
    agent = Agent(
        FunctionModel(model, stream_function=_streamed(model)),
        capabilities=[*others, setup.capability],
    )

    @agent.tool_plain(retries=TOOL_RETRIES)
    def run_shell(command: str) -> str:
        raise ModelRetry("make: *** [all] Error 2")

    return agent


async def _run_stream(agent: Agent[None, str]) -> None:
    async with agent.run_stream("build it") as result:
        async for _ in result.stream_text():
            pass


async def _iter_streaming_every_node(agent: Agent[None, str]) -> None:
    # pydantic-ai's documented pattern: each node's events streamed by hand before it advances;
    # a streamed tools node runs its tools before any node hook.
    async with agent.iter("build it") as run:
        async for node in run:
            if Agent.is_model_request_node(node) or Agent.is_call_tools_node(node):
                async with node.stream(run.ctx) as events:
                    async for _ in events:
                        pass


async def _run_stream_events(agent: Agent[None, str]) -> None:
    async with agent.run_stream_events("build it") as events:
        async for _ in events:
            pass


STREAMING_RUNS = {
    "run_stream": _run_stream,
    "iter": _iter_streaming_every_node,
    "run_stream_events": _run_stream_events,
}


def _plain_run(mode: str) -> dict[str, Any]:
    setup = Setup(mode)
    model = StreamingModel(failing_then_giving_up)
    agent = _streaming_agent(setup, model)
    if mode == "enforce":
        with pytest.raises(RepeatedToolFailureStopped):
            agent.run_sync("build it")
    else:
        assert agent.run_sync("build it").output == "giving up"
    assert model.streamed == 0
    return contract_spans(setup.harness.span_exporter.get_finished_spans())


@pytest.mark.parametrize("run", STREAMING_RUNS)
def test_a_streamed_run_is_guarded_like_run_shadow_then_enforce(run: str) -> None:
    for mode, decisions, reminded in (
        ("shadow", {"tracked": 1, "would_warn": 1, "would_stop": 1}, [False] * 5),
        ("enforce", {"tracked": 1, "warned": 1, "stopped": 1}, [False, False, True]),
    ):
        setup = Setup(mode)
        model = StreamingModel(failing_then_giving_up)
        streamed = STREAMING_RUNS[run](_streaming_agent(setup, model))
        if mode == "enforce":
            with pytest.raises(RepeatedToolFailureStopped):
                asyncio.run(streamed)
        else:
            asyncio.run(streamed)
        assert model.streamed == len(model.requests) == len(reminded), mode
        assert [_has_reminder(r) for r in model.requests] == reminded, mode
        assert setup.decisions() == decisions, mode
        spans = contract_spans(setup.harness.span_exporter.get_finished_spans())
        assert spans == _plain_run(mode), mode
        assert len(spans["batches"]) == min(len(reminded), 4) and not spans["stray"]


@pytest.mark.parametrize("run", ["run_stream", "iter"])
def test_a_streamed_run_beside_pydantic_ais_instrumentation_is_decided_once(run: str) -> None:
    from pydantic_ai.capabilities.instrumentation import Instrumentation
    from pydantic_ai.models.instrumented import InstrumentationSettings

    for mode, decisions, requests in (
        ("shadow", {"tracked": 1, "would_warn": 1, "would_stop": 1}, 5),
        ("enforce", {"tracked": 1, "warned": 1, "stopped": 1}, 3),
    ):
        setup = Setup(mode)
        settings = InstrumentationSettings(
            tracer_provider=setup.harness.tracer_provider, include_content=False
        )
        model = StreamingModel(failing_then_giving_up)
        agent = _streaming_agent(setup, model, Instrumentation(settings=settings))
        streamed = STREAMING_RUNS[run](agent)
        if mode == "enforce":
            with pytest.raises(RepeatedToolFailureStopped):
                asyncio.run(streamed)
        else:
            asyncio.run(streamed)
        assert model.streamed == len(model.requests) == requests, mode
        assert setup.decisions() == decisions, mode
        assert {e.profile for e in setup.evaluations} == {"acp"}
        spans = setup.harness.span_exporter.get_finished_spans()
        tools = [
            s for s in spans if (s.attributes or {}).get("gen_ai.operation.name") == "execute_tool"
        ]
        assert len(tools) == 4 * min(requests, 4)  # pydantic-ai's own, each exported once
        assert not any(k.startswith("acp.") for s in spans for k in (s.attributes or {}))


def test_a_tool_exception_ending_the_run_leaves_its_message_out_of_the_exported_spans() -> None:
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    secret = "CnryErrorZq: permission denied for token sk-live-123"
    setup = Setup("shadow")
    agent = Agent(FunctionModel(ScriptedModel(always_failing(1))), capabilities=[setup.capability])

    @agent.tool_plain
    def run_shell(command: str) -> str:
        raise PermissionError(secret)  # not ModelRetry: it ends the run

    with pytest.raises(PermissionError):
        agent.run_sync("build it")
    spans = setup.harness.span_exporter.get_finished_spans()
    (prompt,) = [s for s in spans if s.name == "invoke_agent"]
    assert prompt.status.status_code.name == "ERROR" and prompt.status.description is None
    assert b"CnryErrorZq" not in encode_spans(spans).SerializeToString()
