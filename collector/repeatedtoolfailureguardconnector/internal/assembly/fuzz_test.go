package assembly

import (
	"testing"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/otel-guard/otel-guard/collector/repeatedtoolfailureguardconnector/internal/spans"
	"github.com/otel-guard/otel-guard/collector/repeatedtoolfailureguardconnector/internal/telemetry"
)

// Attribute choices for fuzzed spans: the guard's keys with well-formed, wrongly typed and
// absurd values.
var fuzzAttrs = []struct {
	key    string
	values []any
}{
	{spans.OperationName, []any{"invoke_agent", "execute_tool", "chat", "other", int64(1)}},
	{spans.PromptID, []any{"p1", "p2", "", int64(7)}},
	{spans.BatchAdmitted, []any{int64(0), int64(1), int64(2), int64(-1), "2", true}},
	{spans.InputReliable, []any{true, false, "true"}},
	{spans.ToolName, []any{"read", "grep", "(merged tools)", "", int64(3)}},
	{spans.ToolCallID, []any{"a", "b", "", "<not specified>", int64(1)}},
	{spans.ToolType, []any{"native", "mcp", "other", false}},
	{spans.ToolStatus, []any{"error", "success", "cancelled", "x"}},
	{spans.ToolExecutionStatus, []any{"error", "success", "not_started", "unknown", int64(0)}},
	{spans.ToolExecutionError, []any{"enoent", "Bad", "", int64(1)}},
	{spans.ErrorType, []any{"ValueError", "", true}},
	{spans.OISpanKind, []any{"AGENT", "CHAIN", "LLM", "TOOL", "chain", int64(2)}},
	{spans.ConversationID, []any{"conv", ""}},
	{spans.PromptRoute, []any{"interactive", "cron", int64(1)}},
}

func fuzzSpans(data []byte) []*spans.Span {
	var out []*spans.Span
	trace := pcommon.TraceID{1}
	for i := 0; len(data) >= 4 && i < 64; i++ {
		h := data[:4]
		data = data[4:]
		s := ptrace.NewSpan()
		s.SetTraceID(trace)
		s.SetSpanID(pcommon.SpanID{byte(i + 1)})
		if h[0]%5 != 0 && i > 0 {
			s.SetParentSpanID(pcommon.SpanID{byte(int(h[0])%i + 1)})
		}
		if h[0]%17 == 3 {
			s.SetParentSpanID(pcommon.SpanID{byte(i + 1)}) // its own parent: a cycle
		}
		s.SetStartTimestamp(pcommon.Timestamp(h[1]))
		s.SetEndTimestamp(pcommon.Timestamp(int(h[1]) + int(h[2]) - 40)) // may end before it starts
		if h[3]&1 == 1 {
			s.Status().SetCode(ptrace.StatusCodeError)
		}
		n := int(h[3]>>1) % 6
		for j := 0; j < n && len(data) > 0; j++ {
			a := fuzzAttrs[int(data[0])%len(fuzzAttrs)]
			v := a.values[int(data[0]>>4)%len(a.values)]
			data = data[1:]
			switch x := v.(type) {
			case string:
				s.Attributes().PutStr(a.key, x)
			case int64:
				s.Attributes().PutInt(a.key, x)
			case bool:
				s.Attributes().PutBool(a.key, x)
			}
		}
		out = append(out, spans.Read(s, telemetry.Resource{}))
	}
	return out
}

var closedDecisions = map[string]bool{"reset": true, "tracked": true, "would_warn": true, "would_stop": true}

// FuzzReplay: any trace, however malformed, replays without a panic, in shadow only, with
// closed values, and the same trace replayed by a fresh guard gives the same output.
func FuzzReplay(f *testing.F) {
	f.Add([]byte{0, 1, 10, 6, 0x10, 0x21, 1, 2, 10, 8, 0x01, 0x22, 0x13, 2, 3, 10, 10, 0x15, 0x06, 0x07, 0x08, 0x09})
	f.Add([]byte{0, 1, 50, 4, 0x0b, 0x1c, 6, 2, 10, 6, 0x0b, 0x0b, 6, 3, 10, 6, 0x2b, 0x0a, 0x1b})
	f.Add([]byte{3, 0, 0, 0xff, 1, 2, 3, 4, 5, 17, 9, 9, 9})
	f.Fuzz(func(t *testing.T, data []byte) {
		part := fuzzSpans(data)
		a := New(Config{MaxPrompts: 3, PromptTTLNanos: 100, MaxCallsPerBatch: 3})
		b := New(Config{MaxPrompts: 3, PromptTTLNanos: 100, MaxCallsPerBatch: 3})
		first, second := a.Replay(part), b.Replay(part)
		if len(first.Transitions) != len(second.Transitions) || len(first.Diagnostics) != len(second.Diagnostics) {
			t.Fatalf("not deterministic")
		}
		for _, tr := range first.Transitions {
			if !closedDecisions[tr.Decision] {
				t.Fatalf("decision %q", tr.Decision)
			}
			if tr.ToolType != "" && tr.ToolType != "native" && tr.ToolType != "mcp" {
				t.Fatalf("tool type %q", tr.ToolType)
			}
		}
		if a.TrackedPrompts() > 3 {
			t.Fatalf("%d prompts kept over the bound", a.TrackedPrompts())
		}
	})
}
