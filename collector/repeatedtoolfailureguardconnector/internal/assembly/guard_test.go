package assembly

import (
	"testing"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/otel-guard/otel-guard/collector/repeatedtoolfailureguardconnector/internal/spans"
	"github.com/otel-guard/otel-guard/collector/repeatedtoolfailureguardconnector/internal/telemetry"
)

const ms = uint64(1_000_000)

type builder struct {
	trace pcommon.TraceID
	next  byte
	out   []*spans.Span
}

func newBuilder(t byte) *builder { return &builder{trace: pcommon.TraceID{t, 1}} }

// span adds an ended span; attrs values are string, int, bool.
func (b *builder) span(parent pcommon.SpanID, start, end uint64, attrs map[string]any, mutate ...func(ptrace.Span)) pcommon.SpanID {
	b.next++
	s := ptrace.NewSpan()
	s.SetTraceID(b.trace)
	id := pcommon.SpanID{b.trace[0], b.next}
	s.SetSpanID(id)
	s.SetParentSpanID(parent)
	s.SetStartTimestamp(pcommon.Timestamp(start))
	s.SetEndTimestamp(pcommon.Timestamp(end))
	if err := s.Attributes().FromRaw(attrs); err != nil {
		panic(err)
	}
	for _, m := range mutate {
		m(s)
	}
	b.out = append(b.out, spans.Read(s, telemetry.Resource{ServiceVersion: "1"}))
	return id
}

func record(g *Guard) *[]Evaluation {
	var evs []Evaluation
	g.OnEvaluation = func(e Evaluation) { evs = append(evs, e) }
	return &evs
}

func values(evs []Evaluation) []string {
	var out []string
	for _, e := range evs {
		if e.Value != "" {
			out = append(out, e.Value)
		}
	}
	return out
}

func count(out telemetry.Output, name string) int {
	n := 0
	for _, d := range out.Diagnostics {
		if d.Name == name {
			n++
		}
	}
	return n
}

func defaultGuard() *Guard {
	return New(Config{MaxPrompts: 100, PromptTTLNanos: 3600 * 1000 * ms})
}

func errored(exceptionType string) func(ptrace.Span) {
	return func(s ptrace.Span) {
		s.Status().SetCode(ptrace.StatusCodeError)
		e := s.Events().AppendEmpty()
		e.SetName("exception")
		e.Attributes().PutStr("exception.type", exceptionType)
	}
}

// OpenInference (section 3c): AGENT is the prompt, LLM a model call, TOOL a tool call typed by
// the last exception event; the prompt ID is session.id; it is never enforced.
func TestOpenInferenceProfile(t *testing.T) {
	b := newBuilder(1)
	agent := b.span(pcommon.SpanID{}, 1*ms, 1000*ms, map[string]any{"openinference.span.kind": "AGENT", "session.id": "sess-1"})
	at := uint64(2)
	for round := 0; round < 4; round++ {
		b.span(agent, at*ms, (at+1)*ms, map[string]any{"openinference.span.kind": "LLM"})
		for c := 0; c < 4; c++ {
			b.span(agent, (at+2)*ms, (at+3)*ms, map[string]any{"openinference.span.kind": "TOOL", "tool.name": "search"}, errored("TimeoutError"))
		}
		at += 10
	}
	g := defaultGuard()
	evs := record(g)
	g.Replay(b.out)
	got := values(*evs)
	want := []string{"tracked", "would_warn", "would_stop"}
	if len(got) != len(want) {
		t.Fatalf("decisions %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("decisions %v, want %v", got, want)
		}
	}
	e := (*evs)[0]
	if e.PromptID != "sess-1" || e.Profile != spans.ProfileOpenInference || !e.Before.EnforcementDisabled {
		t.Fatalf("evaluation %+v", e)
	}
	if k := e.Decision.State.Key; k == nil || k.ExecutionErrorType != "timeouterror" {
		t.Fatalf("key %+v", k)
	}
}

// A root CHAIN is a prompt; a CHAIN below another span is not.
func TestOpenInferenceRootChain(t *testing.T) {
	for _, root := range []bool{true, false} {
		b := newBuilder(2)
		top := pcommon.SpanID{}
		if !root {
			top = b.span(pcommon.SpanID{}, 0, 1000*ms, map[string]any{"http.method": "POST"})
		}
		chain := b.span(top, 1*ms, 900*ms, map[string]any{"openinference.span.kind": "CHAIN"})
		b.span(chain, 2*ms, 3*ms, map[string]any{"openinference.span.kind": "LLM"})
		b.span(chain, 4*ms, 5*ms, map[string]any{"openinference.span.kind": "TOOL", "tool.name": "x"}, errored("E"))
		g := defaultGuard()
		evs := record(g)
		g.Replay(b.out)
		if (len(*evs) == 1) != root {
			t.Fatalf("root=%v: %d evaluations", root, len(*evs))
		}
		if root && (*evs)[0].PromptID != spans.Hex16(chain) {
			t.Fatalf("prompt ID %q", (*evs)[0].PromptID)
		}
	}
}

// A tool call belongs to its prompt through an intermediate span that ended first, and the
// outermost of nested invoke_agent spans is the prompt.
func TestLineageThroughEndedAncestors(t *testing.T) {
	b := newBuilder(3)
	outer := b.span(pcommon.SpanID{}, 1*ms, 1000*ms, map[string]any{"gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": "conv"})
	inner := b.span(outer, 2*ms, 900*ms, map[string]any{"gen_ai.operation.name": "invoke_agent"})
	step := b.span(inner, 3*ms, 4*ms, map[string]any{"framework.step": "run"})
	b.span(inner, 3*ms, 4*ms, map[string]any{"gen_ai.operation.name": "chat"})
	// The tool span ends after the step that is its parent.
	b.span(step, 3*ms, 8*ms, map[string]any{"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "t", "gen_ai.tool.call.id": "1", "error.type": "Boom"})
	b.span(inner, 10*ms, 11*ms, map[string]any{"gen_ai.operation.name": "chat"})
	g := defaultGuard()
	evs := record(g)
	g.Replay(b.out)
	if len(*evs) != 1 || (*evs)[0].PromptID != "conv" || (*evs)[0].Value != "tracked" || !(*evs)[0].Input.Batch.Complete {
		t.Fatalf("evaluations %+v", *evs)
	}
}

// ADK's merged tool span is not a call; a placeholder call ID counts as missing (the span ID).
func TestMergedToolsAndPlaceholderCallID(t *testing.T) {
	b := newBuilder(4)
	p := b.span(pcommon.SpanID{}, 1*ms, 100*ms, map[string]any{"gen_ai.operation.name": "invoke_agent"})
	b.span(p, 2*ms, 3*ms, map[string]any{"gen_ai.operation.name": "chat"})
	b.span(p, 4*ms, 9*ms, map[string]any{"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "(merged tools)", "gen_ai.tool.call.id": "m"})
	a := b.span(p, 5*ms, 6*ms, map[string]any{"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "t", "gen_ai.tool.call.id": "<not specified>", "error.type": "e"})
	c := b.span(p, 5*ms, 6*ms, map[string]any{"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "t", "gen_ai.tool.call.id": "", "error.type": "e"})
	g := defaultGuard()
	evs := record(g)
	g.Replay(b.out)
	obs := (*evs)[0].Input.Batch.Observations
	if len(obs) != 2 || obs[0].CallID != spans.Hex16(a) || obs[1].CallID != spans.Hex16(c) {
		t.Fatalf("observations %+v", obs)
	}
}

func acpPrompt(b *builder, id string, start, end uint64, extra map[string]any) pcommon.SpanID {
	attrs := map[string]any{"gen_ai.operation.name": "invoke_agent", "acp.prompt.id": id}
	for k, v := range extra {
		attrs[k] = v
	}
	return b.span(pcommon.SpanID{}, start, end, attrs)
}

func acpBatch(b *builder, parent pcommon.SpanID, id string, start uint64, calls int) pcommon.SpanID {
	batch := b.span(parent, start, start+50*ms, map[string]any{"acp.prompt.id": id, "acp.batch.admitted": int64(calls), "acp.input.reliable": true})
	for c := 0; c < calls; c++ {
		b.span(batch, start+1*ms, start+2*ms, map[string]any{
			"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "read", "gen_ai.tool.call.id": string(rune('a' + c)),
			"acp.tool.type": "native", "acp.tool.status": "error", "acp.tool.execution.status": "error", "acp.tool.execution.error_type": "enoent",
		})
	}
	return batch
}

// A tool span arriving in a later part of its trace, after its batch span was replayed, is a
// late_span, not an observation.
func TestLateSection3Call(t *testing.T) {
	b := newBuilder(5)
	batch := acpBatch(b, pcommon.SpanID{}, "p", 1*ms, 1)
	first := b.out
	b.out = nil
	b.span(batch, 2*ms, 3*ms, map[string]any{"gen_ai.operation.name": "execute_tool", "gen_ai.tool.call.id": "z", "acp.tool.type": "native"})
	g := defaultGuard()
	g.Replay(first)
	out := g.Replay(b.out)
	if count(out, telemetry.DiagLateSpan) != 1 || g.Batches != 1 {
		t.Fatalf("late spans %d, batches %d", count(out, telemetry.DiagLateSpan), g.Batches)
	}
}

// max_prompts evicts the oldest idle prompt first; the TTL (span time) expires prompts.
func TestEvictionAndExpiry(t *testing.T) {
	b := newBuilder(6)
	acpBatch(b, pcommon.SpanID{}, "p1", 1*ms, 1)
	acpBatch(b, pcommon.SpanID{}, "p2", 100*ms, 1)
	acpBatch(b, pcommon.SpanID{}, "p3", 200*ms, 1)
	g := New(Config{MaxPrompts: 2, PromptTTLNanos: 3600 * 1000 * ms})
	out := g.Replay(b.out)
	if count(out, telemetry.DiagEvicted) != 1 || g.TrackedPrompts() != 2 {
		t.Fatalf("evicted %d, tracked %d", count(out, telemetry.DiagEvicted), g.TrackedPrompts())
	}
	g = New(Config{MaxPrompts: 10, PromptTTLNanos: 50 * ms})
	out = g.Replay(b.out)
	if count(out, telemetry.DiagExpired) != 2 || g.TrackedPrompts() != 1 {
		t.Fatalf("expired %d, tracked %d", count(out, telemetry.DiagExpired), g.TrackedPrompts())
	}
}

// A dropped prompt's state is rebuilt with enforcement disabled while its prompt span is open.
func TestRebuiltStateNeverEnforces(t *testing.T) {
	b := newBuilder(7)
	p := acpPrompt(b, "keep", 0, 10_000*ms, nil)
	acpBatch(b, p, "keep", 1*ms, 1)
	acpBatch(b, pcommon.SpanID{}, "other", 100*ms, 1)
	acpBatch(b, p, "keep", 200*ms, 1)
	g := New(Config{MaxPrompts: 1, PromptTTLNanos: 3600 * 1000 * ms})
	evs := record(g)
	g.Replay(b.out)
	last := (*evs)[len(*evs)-1]
	if last.PromptID != "keep" || !last.Before.EnforcementDisabled {
		t.Fatalf("last evaluation %+v", last)
	}
}

// Two prompt spans open at once with one ID: prompt_collision, enforcement disabled.
func TestPromptCollision(t *testing.T) {
	b := newBuilder(8)
	p := acpPrompt(b, "dup", 0, 1000*ms, nil)
	acpPrompt(b, "dup", 5*ms, 900*ms, nil)
	acpBatch(b, p, "dup", 10*ms, 1)
	g := defaultGuard()
	evs := record(g)
	out := g.Replay(b.out)
	if count(out, telemetry.DiagPromptCollision) != 1 || !(*evs)[0].Before.EnforcementDisabled {
		t.Fatalf("collisions %d, %+v", count(out, telemetry.DiagPromptCollision), *evs)
	}
}

// A GenAI prompt span with the same ID as an open section 3 prompt span is a collision too.
func TestCollisionAcrossProfiles(t *testing.T) {
	b := newBuilder(9)
	acpPrompt(b, "conv", 0, 1000*ms, nil)
	b2 := newBuilder(10)
	b2.span(pcommon.SpanID{}, 5*ms, 900*ms, map[string]any{"gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": "conv"})
	g := defaultGuard()
	all := append(b.out, b2.out...)
	out := g.Replay(all)
	if count(out, telemetry.DiagPromptCollision) != 1 {
		t.Fatalf("collisions %d", count(out, telemetry.DiagPromptCollision))
	}
}

// More calls than a batch may keep: batch_overflow, and the batch is incomplete.
func TestBatchOverflow(t *testing.T) {
	b := newBuilder(11)
	acpBatch(b, pcommon.SpanID{}, "p", 1*ms, 3)
	g := New(Config{MaxPrompts: 10, PromptTTLNanos: 3600 * 1000 * ms, MaxCallsPerBatch: 2})
	evs := record(g)
	out := g.Replay(b.out)
	if count(out, telemetry.DiagBatchOverflow) != 1 || (*evs)[0].Input.Batch.Complete {
		t.Fatalf("overflow %d, %+v", count(out, telemetry.DiagBatchOverflow), *evs)
	}
}

// Opted-out prompts (route, channel marker) get no evaluation at all.
func TestOptedOutPrompt(t *testing.T) {
	b := newBuilder(12)
	p := acpPrompt(b, "cron", 0, 1000*ms, map[string]any{"acp.prompt.route": "cron"})
	acpBatch(b, p, "cron", 1*ms, 4)
	g := defaultGuard()
	evs := record(g)
	out := g.Replay(b.out)
	if len(*evs) != 0 || len(out.Transitions) != 0 {
		t.Fatalf("opted-out prompt evaluated: %+v", *evs)
	}
}

// Classification reads the attributes a span ended with: an execute_tool span that gained its
// tool attributes after it started is still a call (nothing here knows the start attributes).
func TestMalformedValuesNeverPanic(t *testing.T) {
	b := newBuilder(13)
	batch := b.span(pcommon.SpanID{}, 1*ms, 9*ms, map[string]any{"acp.prompt.id": "p", "acp.batch.admitted": "two", "acp.input.reliable": "yes"})
	b.span(batch, 2*ms, 3*ms, map[string]any{"gen_ai.operation.name": "execute_tool", "gen_ai.tool.call.id": int64(3), "acp.tool.type": true, "acp.tool.status": []any{"x"}})
	b.span(batch, 2*ms, 1*ms, map[string]any{"gen_ai.operation.name": "execute_tool"}) // ends before it starts
	b.span(pcommon.SpanID{9}, 0, 0, map[string]any{"acp.prompt.id": int64(1)})
	g := defaultGuard()
	evs := record(g)
	g.Replay(b.out)
	if len(*evs) != 1 || (*evs)[0].Decision.Kind != "reset" && (*evs)[0].Decision.Kind != "none" {
		t.Fatalf("%+v", *evs)
	}
}

// A prompt ID of more than 256 characters is kept as its digest: equal IDs still meet, the
// diagnostic long_prompt_id is counted and the ID itself is never named.
func TestLongPromptIDKeptAsDigest(t *testing.T) {
	id := ""
	for len(id) < 300 {
		id += "prompt-"
	}
	b := newBuilder(14)
	acpBatch(b, pcommon.SpanID{}, id, 1*ms, 4)
	acpBatch(b, pcommon.SpanID{}, id, 100*ms, 4)
	g := defaultGuard()
	evs := record(g)
	out := g.Replay(b.out)
	if count(out, telemetry.DiagLongPromptID) != 2 || len(*evs) != 2 || (*evs)[1].Value != "would_warn" {
		t.Fatalf("long IDs %d, %+v", count(out, telemetry.DiagLongPromptID), *evs)
	}
	if got := (*evs)[0].PromptID; len(got) != 71 || got[:7] != "sha256:" {
		t.Fatalf("prompt ID %q", got)
	}
}

// A half-written section 3 span is counted (missing_attribute), as the Python guard counts it:
// a tool-call span without a required attribute, a batch span without its drain's
// reliability; a declared third-party tool type is not missing, and an off prompt gets none.
func TestMissingAttribute(t *testing.T) {
	tool := func(drop string) map[string]any {
		attrs := map[string]any{
			"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "run_shell",
			"gen_ai.tool.call.id": "c-" + drop, "acp.tool.type": "native",
			"acp.tool.status": "error", "acp.tool.execution.status": "error",
			"acp.tool.execution.error_type": "exit_nonzero",
		}
		delete(attrs, drop)
		return attrs
	}
	b := newBuilder(15)
	batch := b.span(pcommon.SpanID{}, 1*ms, 9*ms, map[string]any{"acp.prompt.id": "p", "acp.batch.admitted": int64(6)})
	for _, drop := range []string{"gen_ai.tool.name", "gen_ai.tool.call.id", "acp.tool.type", "acp.tool.status", "acp.tool.execution.status", "none"} {
		b.span(batch, 2*ms, 3*ms, tool(drop))
	}
	third := tool("none")
	third["acp.tool.type"] = "extension"
	whole := b.span(pcommon.SpanID{}, 10*ms, 19*ms, map[string]any{"acp.prompt.id": "q", "acp.batch.admitted": int64(1), "acp.input.reliable": true})
	b.span(whole, 11*ms, 12*ms, third)
	off := b.span(pcommon.SpanID{}, 20*ms, 29*ms, map[string]any{"acp.prompt.id": "r", "acp.batch.admitted": int64(1), "acp.prompt.route": "cron"})
	b.span(off, 21*ms, 22*ms, tool("acp.tool.type"))
	out := defaultGuard().Replay(b.out)
	// Five tool-call spans and the first batch span (no acp.input.reliable).
	if got := count(out, telemetry.DiagMissingAttribute); got != 6 {
		t.Fatalf("missing_attribute %d", got)
	}
}

func genaiTool(b *builder, parent pcommon.SpanID, start, end uint64, call string) {
	b.span(parent, start, end, map[string]any{"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "read_file", "gen_ai.tool.call.id": call, "error.type": "FileNotFoundError"})
}

func chat(b *builder, parent pcommon.SpanID, start, end uint64) {
	b.span(parent, start, end, map[string]any{"gen_ai.operation.name": "chat"})
}

// Two inferred prompt spans open at once with one conversation ID are a collision, and each
// is decided on its own (otel_guard/spans/assembly.py settles each prompt whole): their
// batches never add up to one streak.
func TestOverlappingInferredPromptsWithOneID(t *testing.T) {
	b := newBuilder(20)
	root := b.span(pcommon.SpanID{}, 0, 1000*ms, map[string]any{"http.method": "POST"})
	agent := map[string]any{"gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": "same"}
	first := b.span(root, 1*ms, 900*ms, agent)
	second := b.span(root, 2*ms, 901*ms, agent)
	at := uint64(10)
	for round := 0; round < 2; round++ {
		for _, p := range []pcommon.SpanID{first, second} {
			chat(b, p, at*ms, (at+1)*ms)
			for c := uint64(0); c < 3; c++ {
				genaiTool(b, p, (at+2+c)*ms, (at+3+c)*ms, string(rune('a'+at+c)))
			}
			at += 10
		}
	}
	chat(b, first, at*ms, (at+1)*ms)
	chat(b, second, (at+2)*ms, (at+3)*ms)
	g := defaultGuard()
	evs := record(g)
	out := g.Replay(b.out)
	if got := values(*evs); len(got) != 4 || got[0] != "tracked" || got[1] != "tracked" || got[2] != "tracked" || got[3] != "tracked" {
		t.Fatalf("decisions %v, want four tracked", got)
	}
	if n := count(out, telemetry.DiagPromptCollision); n != 1 {
		t.Fatalf("collisions %d, want 1", n)
	}
}

// The same across traces: the second prompt span, in a trace of its own, opened while the
// first was open.
func TestOverlappingInferredPromptsAcrossTraces(t *testing.T) {
	agent := map[string]any{"gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": "same"}
	b1, b2 := newBuilder(21), newBuilder(22)
	p1 := b1.span(pcommon.SpanID{}, 0, 100*ms, agent)
	p2 := b2.span(pcommon.SpanID{}, 50*ms, 200*ms, agent)
	chat(b1, p1, 1*ms, 2*ms)
	genaiTool(b1, p1, 3*ms, 4*ms, "1")
	chat(b1, p1, 5*ms, 6*ms)
	chat(b2, p2, 51*ms, 52*ms)
	genaiTool(b2, p2, 53*ms, 54*ms, "2")
	chat(b2, p2, 55*ms, 56*ms)
	g := defaultGuard()
	out := g.Replay(b1.out)
	out.Append(g.Replay(b2.out))
	if n := count(out, telemetry.DiagPromptCollision); n != 1 {
		t.Fatalf("collisions %d, want 1", n)
	}
	// One after the other is no collision (turns of one conversation).
	b3 := newBuilder(23)
	p3 := b3.span(pcommon.SpanID{}, 300*ms, 400*ms, agent)
	chat(b3, p3, 301*ms, 302*ms)
	genaiTool(b3, p3, 303*ms, 304*ms, "3")
	chat(b3, p3, 305*ms, 306*ms)
	if n := count(g.Replay(b3.out), telemetry.DiagPromptCollision); n != 0 {
		t.Fatalf("collisions %d for a later turn", n)
	}
}

// A prompt settles when its trace's local root ends, from the spans that had ended by then: a
// tool call or a model call that ends after the root is an orphan, never a late call of an
// incomplete batch nor the end of a batch's window (as the Python guard reads ended spans).
func TestSpansEndingAfterTheirRootAreOrphans(t *testing.T) {
	b := newBuilder(24)
	prompt := b.span(pcommon.SpanID{}, 0, 500*ms, map[string]any{"gen_ai.operation.name": "invoke_agent"})
	at := uint64(1)
	for round := 0; round < 3; round++ {
		chat(b, prompt, at*ms, (at+1)*ms)
		for c := uint64(0); c < 3; c++ {
			genaiTool(b, prompt, (at+2+c)*ms, (at+3+c)*ms, string(rune('a'+at+c)))
		}
		at += 10
	}
	chat(b, prompt, at*ms, (at+1)*ms)
	genaiTool(b, prompt, (at+2)*ms, (at+3)*ms, "x")
	genaiTool(b, prompt, (at+2)*ms, 400*ms, "y")
	// Starts before the prompt ends, ends after it: unknown when the prompt settles.
	chat(b, prompt, 300*ms, 600*ms)
	// Starts and ends after it.
	genaiTool(b, prompt, 550*ms, 560*ms, "z")
	g := defaultGuard()
	evs := record(g)
	out := g.Replay(b.out)
	got := values(*evs)
	want := []string{"tracked", "tracked", "would_warn", "would_stop"}
	if len(got) != len(want) {
		t.Fatalf("decisions %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("decisions %v, want %v", got, want)
		}
	}
	if n := count(out, telemetry.DiagLateSpan); n != 0 {
		t.Fatalf("late spans %d, want none", n)
	}
}

// An opted-out prompt gets no telemetry at all (section 3), diagnostics included: a late call
// of its batch, a batch over the call bound and an over-long prompt ID are not reported for
// it, as the Python guard reports none of them.
func TestOptedOutPromptGetsNoDiagnostics(t *testing.T) {
	long := ""
	for len(long) < 300 {
		long += "prompt-"
	}
	for _, id := range []string{"cron", long} {
		b := newBuilder(25)
		p := acpPrompt(b, id, 0, 1000*ms, map[string]any{"acp.prompt.route": "cron"})
		batch := acpBatch(b, p, id, 1*ms, 3)
		// Ends after its batch span (which ended at 51 ms): late.
		b.span(batch, 2*ms, 60*ms, map[string]any{
			"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "read", "gen_ai.tool.call.id": "late",
			"acp.tool.type": "native", "acp.tool.status": "error", "acp.tool.execution.status": "error", "acp.tool.execution.error_type": "enoent",
		})
		// A batch span that opts out itself, with more calls than the bound.
		acpBatch(b, pcommon.SpanID{}, "off-batch", 2000*ms, 3)
		b.out[len(b.out)-4].Route = spans.Str{Set: true, Value: "background"}
		g := New(Config{MaxPrompts: 10, PromptTTLNanos: 3600 * 1000 * ms, MaxCallsPerBatch: 2})
		if out := g.Replay(b.out); len(out.Diagnostics) != 0 || len(out.Transitions) != 0 {
			t.Fatalf("prompt %.10q: diagnostics %+v, transitions %d", id, out.Diagnostics, len(out.Transitions))
		}
	}
	// The same spans of a guarded prompt are reported.
	b := newBuilder(26)
	p := acpPrompt(b, "guarded", 0, 1000*ms, nil)
	batch := acpBatch(b, p, "guarded", 1*ms, 1)
	b.span(batch, 2*ms, 60*ms, map[string]any{"gen_ai.operation.name": "execute_tool", "gen_ai.tool.call.id": "late", "acp.tool.type": "native"})
	if out := defaultGuard().Replay(b.out); count(out, telemetry.DiagLateSpan) != 1 {
		t.Fatalf("late spans %d, want 1", count(out, telemetry.DiagLateSpan))
	}
}

// An inferred prompt with a section 3 prompt span anywhere below it is that host's prompt
// described by section 3 (an integration inside an instrumented LangGraph run): it is not
// evaluated, whether the node span between them ended before the section 3 prompt span or
// after it. A section 3 prompt span beside the inferred prompt leaves it evaluated.
func TestSection3PromptBelowAnInferredPrompt(t *testing.T) {
	build := func(nodeEnd uint64, beside bool) []*spans.Span {
		b := newBuilder(12)
		top := pcommon.SpanID{}
		if beside {
			top = b.span(pcommon.SpanID{}, 0, 1000*ms, map[string]any{"http.method": "POST"})
		}
		agent := b.span(top, 1*ms, 999*ms, map[string]any{"gen_ai.operation.name": "invoke_agent"})
		workflow := b.span(agent, 2*ms, 998*ms, map[string]any{"gen_ai.operation.name": "invoke_agent"})
		for round := uint64(0); round < 4; round++ {
			at := (10 + 100*round) * ms
			b.span(workflow, at, at+1*ms, map[string]any{"gen_ai.operation.name": "chat"})
			b.span(workflow, at+2*ms, at+3*ms, map[string]any{"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "t", "gen_ai.tool.call.id": string(rune('a' + round)), "error.type": "Boom"})
		}
		parent := workflow
		if beside {
			parent = top
		}
		node := b.span(parent, 3*ms, nodeEnd, map[string]any{"gen_ai.operation.name": "execute_task"})
		p := b.span(node, 4*ms, 990*ms, map[string]any{"gen_ai.operation.name": "invoke_agent", "acp.prompt.id": "p"})
		acpBatch(b, p, "p", 20*ms, 1)
		return b.out
	}
	for _, c := range []struct {
		name    string
		nodeEnd uint64
		beside  bool
	}{{"node ended before", 5 * ms, false}, {"node ended after", 995 * ms, false}, {"beside", 995 * ms, true}} {
		g := defaultGuard()
		evs := record(g)
		g.Replay(build(c.nodeEnd, c.beside))
		inferred := 0
		for _, e := range *evs {
			if e.Profile != spans.ProfileACP {
				inferred++
			}
		}
		if want := map[bool]int{false: 0, true: 4}[c.beside]; inferred != want || len(*evs) != want+1 {
			t.Fatalf("%s: %d inferred of %d evaluations, want %d", c.name, inferred, len(*evs), want)
		}
	}
}

// A section 3 tool span's placeholder call ID is a missing one, as in the inferred profiles and
// the Python guard: the batch's two calls have one usable ID, so it is incomplete and decides
// nothing (a missing_attribute diagnostic), where two literal IDs would be tracked.
func TestSection3PlaceholderCallIDIsMissing(t *testing.T) {
	for _, tc := range []struct {
		first string
		want  []string
	}{{"a", []string{"tracked"}}, {"<not specified>", nil}, {" <not specified> ", nil}} {
		b := newBuilder(40)
		batch := b.span(pcommon.SpanID{}, 1*ms, 50*ms, map[string]any{"acp.prompt.id": "p", "acp.batch.admitted": int64(2), "acp.input.reliable": true})
		for i, id := range []string{tc.first, "b"} {
			b.span(batch, uint64(2+i)*ms, uint64(3+i)*ms, map[string]any{
				"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "read", "gen_ai.tool.call.id": id,
				"acp.tool.type": "native", "acp.tool.status": "error", "acp.tool.execution.status": "error", "acp.tool.execution.error_type": "enoent",
			})
		}
		g := defaultGuard()
		evs := record(g)
		out := g.Replay(b.out)
		if got := values(*evs); len(got) != len(tc.want) || (len(got) > 0 && got[0] != tc.want[0]) {
			t.Fatalf("call ID %q: decisions %v, want %v", tc.first, got, tc.want)
		}
		if missing := count(out, telemetry.DiagMissingAttribute); (tc.want == nil) != (missing == 1) {
			t.Fatalf("call ID %q: missing_attribute %d", tc.first, missing)
		}
	}
}

// Lineage runs through ancestors that ended by the time the prompt settles (its local root's
// end), as otel_guard reads ended spans: a tool below a span that outlives the root belongs to
// no prompt, even though its trace names every ancestor.
func TestLineageStopsAtAnAncestorEndingAfterTheRoot(t *testing.T) {
	for _, outlives := range []bool{false, true} {
		b := newBuilder(41)
		prompt := b.span(pcommon.SpanID{}, 0, 500*ms, map[string]any{"gen_ai.operation.name": "invoke_agent"})
		end := uint64(400)
		if outlives {
			end = 600
		}
		step := b.span(prompt, 1*ms, end*ms, map[string]any{"framework.step": "tools"})
		chat(b, prompt, 2*ms, 3*ms)
		genaiTool(b, step, 4*ms, 5*ms, "a")
		genaiTool(b, step, 4*ms, 5*ms, "b")
		g := defaultGuard()
		evs := record(g)
		g.Replay(b.out)
		want := 1
		if outlives {
			want = 0
		}
		if got := values(*evs); len(got) != want {
			t.Fatalf("step outlives the root %v: decisions %v, want %d", outlives, got, want)
		}
	}
}

// A GenAI prompt span below a section 3 prompt span that is not its trace's root is section
// 3's, as below one that is: it decides nothing (the Python guard agrees).
func TestInferredPromptBelowASection3PromptIsSection3s(t *testing.T) {
	b := newBuilder(42)
	root := b.span(pcommon.SpanID{}, 0, 500*ms, map[string]any{"http.route": "/run"})
	section3 := b.span(root, 1*ms, 400*ms, map[string]any{"gen_ai.operation.name": "invoke_agent", "acp.prompt.id": "p"})
	if got := loopBelow(b, section3); len(got) != 0 {
		t.Fatalf("decisions %v, want none", got)
	}
	control := newBuilder(44)
	plain := control.span(pcommon.SpanID{}, 0, 500*ms, map[string]any{"http.route": "/run"})
	if got := loopBelow(control, plain); len(got) != 3 {
		t.Fatalf("the loop below a plain root: decisions %v, want 3", got)
	}
}

// loopBelow adds a GenAI prompt span below parent with three rounds of a failing tool, replays
// the builder's spans and returns the decisions.
func loopBelow(b *builder, parent pcommon.SpanID) []string {
	prompt := b.span(parent, 2*ms, 300*ms, map[string]any{"gen_ai.operation.name": "invoke_agent"})
	for round := uint64(0); round < 3; round++ {
		chat(b, prompt, (10+round*10)*ms, (11+round*10)*ms)
		genaiTool(b, prompt, (12+round*10)*ms, (13+round*10)*ms, string(rune('a'+round)))
	}
	g := defaultGuard()
	evs := record(g)
	g.Replay(b.out)
	return values(*evs)
}

// Below a section 3 prompt span that is its trace's root nothing is inferred, even through a
// span that outlives the root (the Python guard watches no such trace while the root is open).
func TestNothingBelowASection3RootIsInferred(t *testing.T) {
	b := newBuilder(43)
	root := acpPrompt(b, "p", 0, 400*ms, nil)
	outliving := b.span(root, 1*ms, 600*ms, map[string]any{"framework.step": "sub-agent"})
	if got := loopBelow(b, outliving); len(got) != 0 {
		t.Fatalf("decisions %v, want none", got)
	}
}

func section3Call(b *builder, batch pcommon.SpanID, start, end uint64, callID, status string) {
	execution, errType := "error", "enoent"
	if status == "success" {
		execution, errType = "success", ""
	}
	attrs := map[string]any{
		"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "read", "gen_ai.tool.call.id": callID,
		"acp.tool.type": "native", "acp.tool.status": status, "acp.tool.execution.status": execution,
	}
	if errType != "" {
		attrs["acp.tool.execution.error_type"] = errType
	}
	b.span(batch, start, end, attrs)
}

// Of two spans with one call ID, the first to end is the call, wherever it started (section 3:
// a second terminal span for a call ID already seen is ignored), as the Python guard reads it.
func TestTheFirstSpanToEndForACallIDIsTheCall(t *testing.T) {
	b := newBuilder(40)
	p := acpPrompt(b, "p", 0, 1000*ms, nil)
	acpBatch(b, p, "p", 1*ms, 4)
	batch := b.span(p, 100*ms, 150*ms, map[string]any{"acp.prompt.id": "p", "acp.batch.admitted": int64(1), "acp.input.reliable": true})
	section3Call(b, batch, 101*ms, 120*ms, "k1", "error")   // started first, ends second: ignored
	section3Call(b, batch, 102*ms, 110*ms, "k1", "success") // started second, ends first: the call
	g := defaultGuard()
	evs := record(g)
	out := g.Replay(b.out)
	if len(*evs) != 2 || (*evs)[1].Decision.Kind != "reset" || count(out, telemetry.DiagDuplicateSpan) != 1 {
		t.Fatalf("evaluations %+v, duplicates %d", *evs, count(out, telemetry.DiagDuplicateSpan))
	}
	if d := out.Diagnostics[len(out.Diagnostics)-1]; d.SpanID != (pcommon.SpanID{40, 8}) {
		t.Fatalf("duplicate_span names %v, want the span that ended second", d.SpanID)
	}
}

// An off prompt gets no diagnostic of any kind: not for a collision of its spans, nor for its
// state dropped by max_prompts or the TTL.
func TestOffPromptsCollisionsAndDropsAreNotReported(t *testing.T) {
	b := newBuilder(41)
	acpPrompt(b, "cron", 0, 1000*ms, map[string]any{"acp.prompt.route": "cron"})
	acpPrompt(b, "cron", 5*ms, 900*ms, nil) // collides with the opted-out one: the ID is off
	g := defaultGuard()
	if out := g.Replay(b.out); len(out.Diagnostics) != 0 {
		t.Fatalf("diagnostics %+v", out.Diagnostics)
	}
	b = newBuilder(42)
	p := acpPrompt(b, "off", 0, 10_000*ms, map[string]any{"acp.prompt.channel": true})
	acpBatch(b, p, "off", 1*ms, 1)
	acpBatch(b, pcommon.SpanID{}, "other", 100*ms, 1) // evicts the off prompt's state
	g = New(Config{MaxPrompts: 1, PromptTTLNanos: 3600 * 1000 * ms})
	if out := g.Replay(b.out); count(out, telemetry.DiagEvicted) != 0 {
		t.Fatalf("evicted %d, want 0", count(out, telemetry.DiagEvicted))
	}
	g = New(Config{MaxPrompts: 10, PromptTTLNanos: 50 * ms})
	if out := g.Replay(b.out); count(out, telemetry.DiagExpired) != 0 {
		t.Fatalf("expired %d, want 0", count(out, telemetry.DiagExpired))
	}
}

// A batch span that starts inside an open off prompt span stays off when it ends after that
// span, and so do the late calls of a batch that ended off after its prompt span ended.
func TestOffPromptsBatchesOutlivingTheirPromptSpanAreSilent(t *testing.T) {
	b := newBuilder(43)
	p := acpPrompt(b, "cron", 0, 100*ms, map[string]any{"acp.prompt.route": "cron"})
	batch := b.span(p, 10*ms, 150*ms, map[string]any{"acp.prompt.id": "cron", "acp.batch.admitted": int64(1), "acp.input.reliable": true})
	section3Call(b, batch, 11*ms, 20*ms, "a", "error")
	ended := acpBatch(b, p, "cron", 20*ms, 1) // ends at 70 ms
	section3Call(b, ended, 21*ms, 120*ms, "late", "error")
	g := defaultGuard()
	evs := record(g)
	if out := g.Replay(b.out); len(out.Diagnostics) != 0 || len(out.Transitions) != 0 || len(*evs) != 0 {
		t.Fatalf("diagnostics %+v, transitions %d, evaluations %d", out.Diagnostics, len(out.Transitions), len(*evs))
	}
}

// A span with openinference.span.kind and no gen_ai.operation.name is section 3c's even when it
// carries gen_ai.tool.name and gen_ai.tool.call.id: its tool is named by tool.name.
func TestOpenInferenceToolWithGenAIToolKeys(t *testing.T) {
	b := newBuilder(44)
	agent := b.span(pcommon.SpanID{}, 1*ms, 1000*ms, map[string]any{"openinference.span.kind": "AGENT"})
	at := uint64(2)
	for round := 0; round < 3; round++ {
		b.span(agent, at*ms, (at+1)*ms, map[string]any{"openinference.span.kind": "LLM"})
		for c := 0; c < 4; c++ {
			b.span(agent, (at+2)*ms, (at+3)*ms, map[string]any{
				"openinference.span.kind": "TOOL", "tool.name": "bash",
				"gen_ai.tool.name": string(rune('a' + 4*round + c)), "gen_ai.tool.call.id": string(rune('A' + 4*round + c)),
			}, errored("TimeoutError"))
		}
		at += 10
	}
	b.span(agent, at*ms, (at+1)*ms, map[string]any{"openinference.span.kind": "LLM"})
	g := defaultGuard()
	evs := record(g)
	g.Replay(b.out)
	if got := values(*evs); len(got) != 3 || got[0] != "tracked" || got[2] != "would_stop" {
		t.Fatalf("decisions %v, want tracked, would_warn, would_stop", got)
	}
	if (*evs)[0].Profile != spans.ProfileOpenInference {
		t.Fatalf("profile %v", (*evs)[0].Profile)
	}
}

// A provider duplicate is no execution: the observations counter leaves it out, as the Python
// guard does (section 2 drops it).
func TestProviderDuplicatesAreNotObservations(t *testing.T) {
	b := newBuilder(45)
	batch := acpBatch(b, pcommon.SpanID{}, "p", 1*ms, 1)
	b.span(batch, 2*ms, 3*ms, map[string]any{
		"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "read", "gen_ai.tool.call.id": "a",
		"acp.tool.type": "native", "acp.tool.status": "error", "acp.tool.execution.status": "error",
		"acp.tool.execution.error_type": "enoent", "acp.tool.provider_duplicate": true,
	})
	out := defaultGuard().Replay(b.out)
	total := 0
	for _, o := range out.Observations {
		total += o.Count
	}
	if total != 1 {
		t.Fatalf("observations %d, want 1 (the duplicate left out)", total)
	}
}
