package repeatedtoolfailureguardconnector

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/connector/connectortest"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/otel-guard/otel-guard/collector/repeatedtoolfailureguardconnector/internal/metadata"
	"github.com/otel-guard/otel-guard/collector/repeatedtoolfailureguardconnector/internal/telemetry"
)

// traceBuilder writes spans of one trace into a request, with IDs that follow one another.
type traceBuilder struct {
	td    ptrace.Traces
	spans ptrace.SpanSlice
	trace pcommon.TraceID
	next  byte
}

func newTraceBuilder(td ptrace.Traces, trace byte) *traceBuilder {
	var rs ptrace.ResourceSpans
	if td.ResourceSpans().Len() == 0 {
		rs = td.ResourceSpans().AppendEmpty()
		rs.Resource().Attributes().PutStr("service.name", "agent")
		rs.ScopeSpans().AppendEmpty()
	} else {
		rs = td.ResourceSpans().At(0)
	}
	return &traceBuilder{td: td, spans: rs.ScopeSpans().At(0).Spans(), trace: pcommon.TraceID{trace, 1}}
}

func (b *traceBuilder) span(parent pcommon.SpanID, start, end time.Duration, attrs map[string]any) pcommon.SpanID {
	b.next++
	s := b.spans.AppendEmpty()
	s.SetTraceID(b.trace)
	id := pcommon.SpanID{b.trace[0], b.next}
	s.SetSpanID(id)
	s.SetParentSpanID(parent)
	base := time.Date(2025, 12, 2, 0, 0, 0, 0, time.UTC)
	s.SetStartTimestamp(pcommon.NewTimestampFromTime(base.Add(start)))
	s.SetEndTimestamp(pcommon.NewTimestampFromTime(base.Add(end)))
	if err := s.Attributes().FromRaw(attrs); err != nil {
		panic(err)
	}
	return id
}

// acpBatch adds a section 3 batch span with n failing calls of one tool, from at on.
func (b *traceBuilder) acpBatch(parent pcommon.SpanID, promptID string, at time.Duration, n int) {
	batch := b.span(parent, at, at+time.Duration(n+1)*time.Millisecond, map[string]any{
		"acp.prompt.id": promptID, "acp.batch.admitted": int64(n), "acp.input.reliable": true,
	})
	for i := 0; i < n; i++ {
		start := at + time.Duration(i)*time.Millisecond
		b.span(batch, start, start+time.Millisecond/2, map[string]any{
			"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "read_file",
			"gen_ai.tool.call.id": promptID + string(rune('a'+i)) + start.String(),
			"acp.tool.type":       "native", "acp.tool.status": "error",
			"acp.tool.execution.status": "error", "acp.tool.execution.error_type": "enoent",
		})
	}
}

// With the default configuration a prompt keeps its state for as long as the Python guard
// keeps it (DEFAULT_PROMPT_TTL_SECONDS, six hours): batches two hours apart are one streak,
// as `otel-guard replay` decides them (tracked, tracked, would_warn, would_stop), not four
// streaks of a state expired after each batch.
func TestDefaultPromptTTLIsTheGuards(t *testing.T) {
	td := ptrace.NewTraces()
	b := newTraceBuilder(td, 1)
	prompt := b.span(pcommon.SpanID{}, 0, 9*time.Hour, map[string]any{
		"gen_ai.operation.name": "invoke_agent", "acp.prompt.id": "p-slow",
	})
	for i := 1; i <= 4; i++ {
		b.acpBatch(prompt, "p-slow", time.Duration(2*i)*time.Hour, 3)
	}
	metrics, _ := run(t, []ptrace.Traces{td}, createDefaultConfig())
	require.Equal(t, map[string]int{"tracked": 2, "would_warn": 1, "would_stop": 1},
		lastCounts(metrics.AllMetrics(), telemetry.DecisionsMetric, "decision"))
	require.Empty(t, lastCounts(metrics.AllMetrics(), telemetry.DiagnosticsMetric, "diagnostic"))
	require.Equal(t, 6*time.Hour, createDefaultConfig().PromptTTL)
}

// A next consumer that keeps failing is one telemetry_error per output that could not be
// delivered, not one more at every tick for the failed telemetry_error itself.
func TestTelemetryErrorCountedOncePerFailedOutput(t *testing.T) {
	for name, next := range map[string]func() (*guardConnector, error){
		"metrics": func() (*guardConnector, error) {
			c, err := NewFactory().CreateTracesToMetrics(context.Background(), connectortest.NewNopSettings(metadata.Type), createDefaultConfig(), consumertest.NewErr(errors.New("down")))
			if err != nil {
				return nil, err
			}
			return c.(*guardConnector), nil
		},
		"logs": func() (*guardConnector, error) {
			c, err := NewFactory().CreateTracesToLogs(context.Background(), connectortest.NewNopSettings(metadata.Type), createDefaultConfig(), consumertest.NewErr(errors.New("down")))
			if err != nil {
				return nil, err
			}
			return c.(*guardConnector), nil
		},
	} {
		t.Run(name, func(t *testing.T) {
			gc, err := next()
			require.NoError(t, err)
			ctx := context.Background()
			for _, td := range readOTLPJSON(t, filepath.Join("testdata", "demo-traces.jsonl")) {
				require.NoError(t, gc.ConsumeTraces(ctx, td))
			}
			require.Error(t, gc.flush(ctx, true))
			require.Len(t, gc.pending.Diagnostics, 1)
			for i := 0; i < 5; i++ {
				_ = gc.flush(ctx, true)
			}
			require.Empty(t, gc.pending.Diagnostics)
			if m, ok := gc.out.(*metricsEmitter); ok {
				require.Equal(t, 1, lastSeries(m.counters, telemetry.DiagTelemetryError))
			}
			require.NoError(t, gc.Shutdown(ctx), "nothing is left to emit")
		})
	}
}

// lastSeries is the diagnostics counter's value for one diagnostic.
func lastSeries(c *telemetry.Counters, diagnostic string) int {
	return lastCounts([]pmetric.Metrics{c.Metrics(time.Now())}, telemetry.DiagnosticsMetric, "diagnostic")[diagnostic]
}
