package repeatedtoolfailureguardconnector

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"

	"go.opentelemetry.io/collector/connector/connectortest"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/otel-guard/otel-guard/collector/repeatedtoolfailureguardconnector/internal/assembly"
	"github.com/otel-guard/otel-guard/collector/repeatedtoolfailureguardconnector/internal/metadata"
	"github.com/otel-guard/otel-guard/collector/repeatedtoolfailureguardconnector/internal/spans"
	"github.com/otel-guard/otel-guard/collector/repeatedtoolfailureguardconnector/internal/telemetry"
)

// BenchmarkConnectorSpans measures spans per second through the traces->metrics connector:
// buffering, ordering, assembly, the reducer and the counters, from decoded OTLP (as a
// receiver hands it over) to the last export. GUARD_BENCH_FILE names an OTLP/JSON file to use
// (benchmarks/connector.py writes the replay benchmark's file and passes it); without it the
// golden inputs are used. With GUARD_BENCH_OUT set, the decision counts are written there as
// JSON, for comparison with `otel-guard replay` on the same file.
func BenchmarkConnectorSpans(b *testing.B) {
	var requests []ptrace.Traces
	if path := os.Getenv("GUARD_BENCH_FILE"); path != "" {
		requests = readOTLPJSON(b, path)
	} else {
		for _, name := range []string{"demo-traces.jsonl", "genai-traces.jsonl"} {
			requests = append(requests, readOTLPJSON(b, filepath.Join("testdata", name))...)
		}
	}
	total := 0
	for _, td := range requests {
		total += td.SpanCount()
	}
	cfg := createDefaultConfig()
	cpuBefore := processCPU()
	b.ResetTimer()
	var sink *consumertest.MetricsSink
	for i := 0; i < b.N; i++ {
		sink = new(consumertest.MetricsSink)
		c, err := NewFactory().CreateTracesToMetrics(context.Background(), connectortest.NewNopSettings(metadata.Type), cfg, sink)
		if err != nil {
			b.Fatal(err)
		}
		for _, td := range requests {
			if err := c.ConsumeTraces(context.Background(), td); err != nil {
				b.Fatal(err)
			}
		}
		if err := c.Shutdown(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(total)*float64(b.N)/b.Elapsed().Seconds(), "spans/s")
	// On a shared machine wall time says more about the neighbours: spans per CPU second too
	// (the whole process, garbage collector included).
	if cpu := processCPU() - cpuBefore; cpu > 0 {
		b.ReportMetric(float64(total)*float64(b.N)/cpu, "spans/cpu-s")
	}
	if out := os.Getenv("GUARD_BENCH_OUT"); out != "" {
		raw, _ := json.Marshal(map[string]any{
			"spans":     total,
			"decisions": lastCounts(sink.AllMetrics(), telemetry.DecisionsMetric, "decision"),
		})
		if err := os.WriteFile(out, raw, 0o600); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkMemoryPerPrompt measures the heap kept per tracked prompt: prompts each with one
// settled batch whose failing call left it tracking a candidate, and no prompt span to end it.
func BenchmarkMemoryPerPrompt(b *testing.B) {
	const prompts = 20000
	var perPrompt float64
	for i := 0; i < b.N; i++ {
		parts := make([][]*spans.Span, prompts)
		for p := 0; p < prompts; p++ {
			parts[p] = promptPart(p)
		}
		g := assembly.New(assembly.Config{MaxPrompts: prompts, PromptTTLNanos: uint64(time.Hour)})
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for _, part := range parts {
			g.Replay(part)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		runtime.KeepAlive(parts) // the spans are not the prompts' cost: kept out of the delta
		if g.TrackedPrompts() != prompts {
			b.Fatalf("%d prompts tracked", g.TrackedPrompts())
		}
		perPrompt = (float64(after.HeapAlloc) - float64(before.HeapAlloc)) / prompts
		runtime.KeepAlive(g)
	}
	b.ReportMetric(perPrompt, "bytes/prompt")
}

func processCPU() float64 {
	var u syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &u); err != nil {
		return 0
	}
	return time.Duration(u.Utime.Nano() + u.Stime.Nano()).Seconds()
}

func promptPart(p int) []*spans.Span {
	traceID := pcommon.TraceID{byte(p >> 16), byte(p >> 8), byte(p), 1}
	batch := ptrace.NewSpan()
	batch.SetTraceID(traceID)
	batch.SetSpanID(pcommon.SpanID{1})
	batch.SetStartTimestamp(pcommon.Timestamp(1000 + p))
	batch.SetEndTimestamp(pcommon.Timestamp(2000 + p))
	batch.Attributes().PutStr(spans.PromptID, fmt.Sprintf("prompt-%08d", p))
	batch.Attributes().PutInt(spans.BatchAdmitted, 1)
	batch.Attributes().PutBool(spans.InputReliable, true)
	tool := ptrace.NewSpan()
	tool.SetTraceID(traceID)
	tool.SetSpanID(pcommon.SpanID{2})
	tool.SetParentSpanID(pcommon.SpanID{1})
	tool.SetStartTimestamp(pcommon.Timestamp(1100 + p))
	tool.SetEndTimestamp(pcommon.Timestamp(1200 + p))
	for k, v := range map[string]string{
		spans.OperationName: spans.ExecuteTool, spans.ToolName: "read_file", spans.ToolCallID: "c1",
		spans.ToolType: "native", spans.ToolStatus: "error", spans.ToolExecutionStatus: "error", spans.ToolExecutionError: "enoent",
	} {
		tool.Attributes().PutStr(k, v)
	}
	r := telemetry.Resource{ServiceVersion: "1.0.0", DeploymentEnvironment: "prod"}
	return []*spans.Span{spans.Read(tool, r), spans.Read(batch, r)}
}
