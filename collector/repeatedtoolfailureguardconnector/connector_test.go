package repeatedtoolfailureguardconnector

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/connector/connectortest"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/otel-guard/otel-guard/collector/repeatedtoolfailureguardconnector/internal/metadata"
	"github.com/otel-guard/otel-guard/collector/repeatedtoolfailureguardconnector/internal/telemetry"
)

// readOTLPJSON reads a file of OTLP/JSON trace requests, one a line, as the Collector's file
// exporter writes them.
func readOTLPJSON(t testing.TB, path string) []ptrace.Traces {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var out []ptrace.Traces
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	var u ptrace.JSONUnmarshaler
	for sc.Scan() {
		if len(sc.Bytes()) == 0 {
			continue
		}
		td, err := u.UnmarshalTraces(sc.Bytes())
		require.NoError(t, err)
		out = append(out, td)
	}
	require.NoError(t, sc.Err())
	return out
}

// golden is what `otel-guard replay --format json` reports for a file of testdata/
// (testdata/expected.json, checked against the Python replay by tests/test_connector_golden.py).
type golden struct {
	Batches      int            `json:"batches"`
	Decisions    map[string]int `json:"decisions"`
	ResetReasons map[string]int `json:"reset_reasons"`
	Diagnostics  map[string]int `json:"diagnostics"`
}

// goldenDir is testdata, or the directory GUARD_GOLDEN_DIR names: the Python test suite writes
// generated traces and their replay numbers there (tests/test_connector_differential.py).
func goldenDir() string {
	if dir := os.Getenv("GUARD_GOLDEN_DIR"); dir != "" {
		return dir
	}
	return "testdata"
}

func loadGolden(t testing.TB) map[string]golden {
	raw, err := os.ReadFile(filepath.Join(goldenDir(), "expected.json"))
	require.NoError(t, err)
	var g struct {
		Files map[string]golden `json:"files"`
	}
	require.NoError(t, json.Unmarshal(raw, &g))
	require.NotEmpty(t, g.Files)
	return g.Files
}

// run sends the requests through a traces->metrics and a traces->logs connector built by the
// factory, shuts both down (which replays what is still buffered) and returns the sinks.
func run(t testing.TB, requests []ptrace.Traces, cfg *Config) (*consumertest.MetricsSink, *consumertest.LogsSink) {
	f := NewFactory()
	ctx := context.Background()
	metrics := new(consumertest.MetricsSink)
	logs := new(consumertest.LogsSink)
	set := connectortest.NewNopSettings(metadata.Type)
	mc, err := f.CreateTracesToMetrics(ctx, set, cfg, metrics)
	require.NoError(t, err)
	lc, err := f.CreateTracesToLogs(ctx, set, cfg, logs)
	require.NoError(t, err)
	host := componenttest.NewNopHost()
	require.NoError(t, mc.Start(ctx, host))
	require.NoError(t, lc.Start(ctx, host))
	for _, td := range requests {
		require.NoError(t, mc.ConsumeTraces(ctx, td))
		require.NoError(t, lc.ConsumeTraces(ctx, td))
	}
	require.NoError(t, mc.Shutdown(ctx))
	require.NoError(t, lc.Shutdown(ctx))
	return metrics, logs
}

// lastCounts reads the last export's cumulative sums: metric -> attribute value of key -> count.
func lastCounts(md []pmetric.Metrics, metric, key string) map[string]int {
	out := map[string]int{}
	if len(md) == 0 {
		return out
	}
	last := md[len(md)-1]
	for i := 0; i < last.ResourceMetrics().Len(); i++ {
		rm := last.ResourceMetrics().At(i)
		for j := 0; j < rm.ScopeMetrics().Len(); j++ {
			sm := rm.ScopeMetrics().At(j)
			if sm.Scope().Name() != telemetry.ScopeName {
				continue
			}
			for k := 0; k < sm.Metrics().Len(); k++ {
				m := sm.Metrics().At(k)
				if m.Name() != metric {
					continue
				}
				dps := m.Sum().DataPoints()
				for d := 0; d < dps.Len(); d++ {
					v, ok := dps.At(d).Attributes().Get(key)
					if ok {
						out[v.Str()] += int(dps.At(d).IntValue())
					}
				}
			}
		}
	}
	return out
}

func nonZero(m map[string]int) map[string]int {
	out := map[string]int{}
	for k, v := range m {
		if v != 0 {
			out[k] = v
		}
	}
	return out
}

func logRecords(lds []plog.Logs, event string) []plog.LogRecord {
	var out []plog.LogRecord
	for _, ld := range lds {
		for i := 0; i < ld.ResourceLogs().Len(); i++ {
			rl := ld.ResourceLogs().At(i)
			for j := 0; j < rl.ScopeLogs().Len(); j++ {
				sl := rl.ScopeLogs().At(j)
				for k := 0; k < sl.LogRecords().Len(); k++ {
					if lr := sl.LogRecords().At(k); lr.EventName() == event {
						out = append(out, lr)
					}
				}
			}
		}
	}
	return out
}

func TestDecisionCountsEqualReplay(t *testing.T) {
	for file, want := range loadGolden(t) {
		t.Run(file, func(t *testing.T) {
			requests := readOTLPJSON(t, filepath.Join(goldenDir(), file))
			metrics, logs := run(t, requests, createDefaultConfig())
			decisions := lastCounts(metrics.AllMetrics(), telemetry.DecisionsMetric, "decision")
			require.Equal(t, nonZero(want.Decisions), decisions, "decisions")
			reasons := lastCounts(metrics.AllMetrics(), telemetry.DecisionsMetric, "reset_reason")
			require.Equal(t, nonZero(want.ResetReasons), reasons, "reset reasons")
			diagnostics := lastCounts(metrics.AllMetrics(), telemetry.DiagnosticsMetric, "diagnostic")
			require.Equal(t, nonZero(want.Diagnostics), diagnostics, "diagnostics")
			modes := lastCounts(metrics.AllMetrics(), telemetry.DecisionsMetric, "mode")
			for mode := range modes {
				require.Equal(t, "shadow", mode)
			}
			// One transition record per transition, carrying the batch span's trace context.
			records := logRecords(logs.AllLogs(), telemetry.TransitionEvent)
			total := 0
			for _, n := range decisions {
				total += n
			}
			require.Len(t, records, total)
			for _, lr := range records {
				require.False(t, lr.TraceID().IsEmpty())
				require.False(t, lr.SpanID().IsEmpty())
				v, ok := lr.Attributes().Get("mode")
				require.True(t, ok)
				require.Equal(t, "shadow", v.Str())
				_, ok = lr.Attributes().Get("prompt_id")
				require.True(t, ok)
			}
		})
	}
}

// Spans sent in the reverse order, split one span per request, still give replay's counts:
// the wait window puts them back in the order they started and ended.
func TestOutOfOrderSpansGiveTheSameCounts(t *testing.T) {
	want := loadGolden(t)["demo-traces.jsonl"]
	var single []ptrace.Traces
	for _, td := range readOTLPJSON(t, filepath.Join("testdata", "demo-traces.jsonl")) {
		rss := td.ResourceSpans()
		for i := 0; i < rss.Len(); i++ {
			for j := 0; j < rss.At(i).ScopeSpans().Len(); j++ {
				ss := rss.At(i).ScopeSpans().At(j)
				for k := 0; k < ss.Spans().Len(); k++ {
					one := ptrace.NewTraces()
					rs := one.ResourceSpans().AppendEmpty()
					rss.At(i).Resource().CopyTo(rs.Resource())
					s := rs.ScopeSpans().AppendEmpty()
					ss.Scope().CopyTo(s.Scope())
					ss.Spans().At(k).CopyTo(s.Spans().AppendEmpty())
					single = append(single, one)
				}
			}
		}
	}
	for i, j := 0, len(single)-1; i < j; i, j = i+1, j-1 {
		single[i], single[j] = single[j], single[i]
	}
	metrics, _ := run(t, single, createDefaultConfig())
	require.Equal(t, nonZero(want.Decisions), lastCounts(metrics.AllMetrics(), telemetry.DecisionsMetric, "decision"))
}

// The resource's service.version and deployment.environment.name are carried; nothing else
// of the input resource is.
func TestResourceCarried(t *testing.T) {
	requests := readOTLPJSON(t, filepath.Join("testdata", "demo-traces.jsonl"))
	for _, td := range requests {
		for i := 0; i < td.ResourceSpans().Len(); i++ {
			attrs := td.ResourceSpans().At(i).Resource().Attributes()
			attrs.PutStr("service.version", "9.9.9")
			attrs.PutStr("deployment.environment.name", "canary-env")
			attrs.PutStr("host.name", "canary-host")
		}
	}
	metrics, logs := run(t, requests, createDefaultConfig())
	md := metrics.AllMetrics()
	require.NotEmpty(t, md)
	last := md[len(md)-1]
	require.Positive(t, last.ResourceMetrics().Len())
	for i := 0; i < last.ResourceMetrics().Len(); i++ {
		got := last.ResourceMetrics().At(i).Resource().Attributes().AsRaw()
		require.Equal(t, map[string]any{"service.version": "9.9.9", "deployment.environment.name": "canary-env"}, got)
	}
	for _, ld := range logs.AllLogs() {
		for i := 0; i < ld.ResourceLogs().Len(); i++ {
			_, ok := ld.ResourceLogs().At(i).Resource().Attributes().Get("host.name")
			require.False(t, ok)
		}
	}
}

// A trace is replayed once `wait` has passed since its last span arrived, not before; a span
// arriving inside the window restarts it.
func TestWaitWindowReleasesTraces(t *testing.T) {
	requests := readOTLPJSON(t, filepath.Join("testdata", "demo-traces.jsonl"))
	ctx := context.Background()
	gc, metrics, now := clockedConnector(t, time.Minute)
	for _, td := range requests[:len(requests)-1] {
		require.NoError(t, gc.ConsumeTraces(ctx, td))
	}
	*now = now.Add(50 * time.Second)
	require.NoError(t, gc.ConsumeTraces(ctx, requests[len(requests)-1]))
	*now = now.Add(30 * time.Second) // 80 s after the first requests, 30 s after the last
	require.NoError(t, gc.flush(ctx, false))
	released := len(gc.traces)
	require.Positive(t, released, "the last request's traces are still inside their window")
	require.NotEmpty(t, metrics.AllMetrics(), "the earlier traces were replayed")
	*now = now.Add(31 * time.Second)
	require.NoError(t, gc.flush(ctx, false))
	require.Empty(t, gc.traces)
	require.Zero(t, gc.bytes)
	want := loadGolden(t)["demo-traces.jsonl"]
	require.Equal(t, nonZero(want.Decisions), lastCounts(metrics.AllMetrics(), telemetry.DecisionsMetric, "decision"))
	require.NoError(t, gc.Shutdown(ctx))
}

// Past max_call_bytes the traces that waited longest are replayed at once: the buffer stays
// bounded.
func TestBufferBoundedInBytes(t *testing.T) {
	requests := readOTLPJSON(t, filepath.Join("testdata", "demo-traces.jsonl"))
	cfg := createDefaultConfig()
	cfg.MaxCallBytes = 8 << 10
	ctx := context.Background()
	metrics := new(consumertest.MetricsSink)
	c, err := NewFactory().CreateTracesToMetrics(ctx, connectortest.NewNopSettings(metadata.Type), cfg, metrics)
	require.NoError(t, err)
	gc := c.(*guardConnector)
	for _, td := range requests {
		require.NoError(t, c.ConsumeTraces(ctx, td))
		require.LessOrEqual(t, gc.bytes, cfg.MaxCallBytes)
	}
	require.NoError(t, c.Shutdown(ctx))
}

// Tool names and raw error text never leave through the guard; the classified error type
// appears only in transition records.
func TestNoToolNamesInOutput(t *testing.T) {
	requests := readOTLPJSON(t, filepath.Join("testdata", "genai-traces.jsonl"))
	seen := false
	for _, td := range requests {
		eachSpan(td, func(_ pcommon.Resource, span ptrace.Span) {
			if v, ok := span.Attributes().Get("gen_ai.tool.name"); ok && v.Str() == "read_file" {
				span.Attributes().PutStr("gen_ai.tool.name", "canary_tool_name_7f3a")
				seen = true
			}
		})
	}
	require.True(t, seen, "the canary must be in the input")
	metrics, logs := run(t, requests, createDefaultConfig())
	var m pmetric.JSONMarshaler
	for _, md := range metrics.AllMetrics() {
		raw, err := m.MarshalMetrics(md)
		require.NoError(t, err)
		require.NotContains(t, string(raw), "canary_tool_name")
		require.NotContains(t, string(raw), "filenotfounderror")
	}
	var l plog.JSONMarshaler
	errorTypes := 0
	for _, ld := range logs.AllLogs() {
		raw, err := l.MarshalLogs(ld)
		require.NoError(t, err)
		require.NotContains(t, string(raw), "canary_tool_name")
	}
	for _, lr := range logRecords(logs.AllLogs(), telemetry.TransitionEvent) {
		if v, ok := lr.Attributes().Get("execution_error_type"); ok {
			require.Equal(t, "filenotfounderror", v.Str())
			errorTypes++
		}
	}
	require.Positive(t, errorTypes)
}

// A span of a trace already replayed, sent again, is replayed once and counted.
func TestDuplicateSpanCounted(t *testing.T) {
	requests := readOTLPJSON(t, filepath.Join("testdata", "demo-traces.jsonl"))
	cfg := createDefaultConfig()
	f := NewFactory()
	ctx := context.Background()
	metrics := new(consumertest.MetricsSink)
	c, err := f.CreateTracesToMetrics(ctx, connectortest.NewNopSettings(metadata.Type), cfg, metrics)
	require.NoError(t, err)
	gc := c.(*guardConnector)
	for _, td := range requests {
		require.NoError(t, c.ConsumeTraces(ctx, td))
	}
	require.NoError(t, gc.flush(ctx, true))
	first := lastCounts(metrics.AllMetrics(), telemetry.DecisionsMetric, "decision")
	require.NoError(t, c.ConsumeTraces(ctx, requests[0]))
	require.NoError(t, c.Shutdown(ctx))
	require.Equal(t, first, lastCounts(metrics.AllMetrics(), telemetry.DecisionsMetric, "decision"))
	diags := lastCounts(metrics.AllMetrics(), telemetry.DiagnosticsMetric, "diagnostic")
	require.Equal(t, requests[0].SpanCount(), diags[telemetry.DiagDuplicateSpan])
}

func TestConfigValidate(t *testing.T) {
	require.NoError(t, createDefaultConfig().Validate())
	for name, mutate := range map[string]func(*Config){
		"max_prompts zero":     func(c *Config) { c.MaxPrompts = 0 },
		"max_prompts huge":     func(c *Config) { c.MaxPrompts = maxMaxPrompts + 1 },
		"prompt_ttl zero":      func(c *Config) { c.PromptTTL = 0 },
		"max_call_bytes small": func(c *Config) { c.MaxCallBytes = 10 },
		"wait zero":            func(c *Config) { c.Wait = 0 },
		"wait huge":            func(c *Config) { c.Wait = 25 * time.Hour },
		"ttl below wait":       func(c *Config) { c.PromptTTL = time.Second; c.Wait = time.Minute },
	} {
		cfg := createDefaultConfig()
		mutate(cfg)
		require.Error(t, cfg.Validate(), name)
		_, err := NewFactory().CreateTracesToMetrics(context.Background(), connectortest.NewNopSettings(metadata.Type), cfg, consumertest.NewNop())
		require.Error(t, err, name)
	}
}

// A part of a trace that arrives after the trace was replayed (its wait window passed) is
// replayed on its own and said once, as a late_span diagnostic; within the window it is not.
func TestLatePartOfAReplayedTraceCounted(t *testing.T) {
	requests := readOTLPJSON(t, filepath.Join("testdata", "demo-traces.jsonl"))
	children, roots := ptrace.NewTraces(), ptrace.NewTraces()
	traces := map[pcommon.TraceID]bool{}
	for _, td := range requests {
		eachSpan(td, func(resource pcommon.Resource, span ptrace.Span) {
			into := children
			if span.ParentSpanID().IsEmpty() {
				into, traces[span.TraceID()] = roots, true
			}
			rs := into.ResourceSpans().AppendEmpty()
			resource.CopyTo(rs.Resource())
			span.CopyTo(rs.ScopeSpans().AppendEmpty().Spans().AppendEmpty())
		})
	}
	ctx := context.Background()
	late := func(gap time.Duration) int {
		gc, metrics, now := clockedConnector(t, time.Minute)
		require.NoError(t, gc.ConsumeTraces(ctx, children))
		*now = now.Add(gap)
		require.NoError(t, gc.flush(ctx, false))
		require.NoError(t, gc.ConsumeTraces(ctx, roots))
		require.NoError(t, gc.Shutdown(ctx))
		return lastCounts(metrics.AllMetrics(), telemetry.DiagnosticsMetric, "diagnostic")[telemetry.DiagLateSpan]
	}
	require.Zero(t, late(30*time.Second))
	require.Equal(t, len(traces), late(2*time.Minute)) // once per trace, however many spans
}

// eachSpan calls fn with every span of td and its resource.
func eachSpan(td ptrace.Traces, fn func(pcommon.Resource, ptrace.Span)) {
	rss := td.ResourceSpans()
	for i := 0; i < rss.Len(); i++ {
		for j := 0; j < rss.At(i).ScopeSpans().Len(); j++ {
			ss := rss.At(i).ScopeSpans().At(j).Spans()
			for k := 0; k < ss.Len(); k++ {
				fn(rss.At(i).Resource(), ss.At(k))
			}
		}
	}
}

// clockedConnector is a traces-to-metrics connector with the given wait, on a clock the test
// moves by hand (through the returned time).
func clockedConnector(t *testing.T, wait time.Duration) (*guardConnector, *consumertest.MetricsSink, *time.Time) {
	cfg := createDefaultConfig()
	cfg.Wait = wait
	metrics := new(consumertest.MetricsSink)
	c, err := NewFactory().CreateTracesToMetrics(context.Background(), connectortest.NewNopSettings(metadata.Type), cfg, metrics)
	require.NoError(t, err)
	gc := c.(*guardConnector)
	now := time.Unix(1_800_000_000, 0)
	gc.now = func() time.Time { return now }
	return gc, metrics, &now
}
