package telemetry

import (
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/pmetric"
)

func TestBuckets(t *testing.T) {
	for n, want := range map[int]string{-1: "0", 0: "0", 1: "1-2", 2: "1-2", 3: "3-4", 4: "3-4", 5: "5-7", 7: "5-7", 8: "8+", 100: "8+"} {
		if got := FailureCountBucket(n); got != want {
			t.Errorf("FailureCountBucket(%d) = %q, want %q", n, got, want)
		}
	}
	for n, want := range map[int]string{0: "0", 1: "1", 2: "2", 3: "3+", 9: "3+"} {
		if got := BatchCountBucket(n); got != want {
			t.Errorf("BatchCountBucket(%d) = %q, want %q", n, got, want)
		}
	}
	for kind, want := range map[string]string{"none": "", "reset": "reset", "warn": "warned", "stop": "stopped", "would_stop": "would_stop"} {
		if got := DecisionValue(kind); got != want {
			t.Errorf("DecisionValue(%q) = %q", kind, got)
		}
	}
}

func attrs(m pcommon.Map) map[string]any { return m.AsRaw() }

// The decisions counter carries reset_reason only on resets, and terminal_status,
// execution_status and tool_type only on other decisions; records carry prompt_id,
// candidate_ordinal, and execution_error_type only off resets; stopped adds the loop event.
func TestRecordsAndCounters(t *testing.T) {
	r := Resource{ServiceVersion: "1.2.3", DeploymentEnvironment: "prod"}
	out := Output{
		Transitions: []Transition{
			{Resource: r, PromptID: "p", PhaseBefore: "tracking", PhaseAfter: "idle", Decision: "reset", FailureCount: 4, BatchCount: 1, CandidateOrdinal: 1, ResetReason: "success", ExecutionErrorType: "enoent", Timestamp: 5},
			{Resource: r, PromptID: "p", PhaseBefore: "warned", PhaseAfter: "latched", Decision: "stopped", FailureCount: 12, BatchCount: 3, CandidateOrdinal: 2, ToolType: "mcp", ExecutionErrorType: "enoent", TraceID: pcommon.TraceID{1}, SpanID: pcommon.SpanID{2}, Timestamp: 6},
		},
		Diagnostics:  []Diagnostic{{Resource: r, Name: DiagEvicted, PromptID: "q"}, {Resource: r, Name: DiagInternalError}},
		Observations: []Observation{{Resource: r, ExecutionStatus: "error", ToolType: "mcp", Count: 3}},
	}
	c := NewCounters(time.Unix(100, 0))
	c.Add(out)
	c.Add(out)
	md := c.Metrics(time.Unix(200, 0))
	if md.ResourceMetrics().Len() != 1 {
		t.Fatalf("%d resources", md.ResourceMetrics().Len())
	}
	rm := md.ResourceMetrics().At(0)
	if got := attrs(rm.Resource().Attributes()); len(got) != 2 || got["service.version"] != "1.2.3" || got["deployment.environment.name"] != "prod" {
		t.Fatalf("resource %v", got)
	}
	sm := rm.ScopeMetrics().At(0)
	if sm.Scope().Name() != "otel_guard" {
		t.Fatalf("scope %q", sm.Scope().Name())
	}
	found := map[string]int{}
	for i := 0; i < sm.Metrics().Len(); i++ {
		m := sm.Metrics().At(i)
		if m.Type() != pmetric.MetricTypeSum || !m.Sum().IsMonotonic() || m.Sum().AggregationTemporality() != pmetric.AggregationTemporalityCumulative {
			t.Fatalf("%s is not a cumulative monotonic sum", m.Name())
		}
		for j := 0; j < m.Sum().DataPoints().Len(); j++ {
			dp := m.Sum().DataPoints().At(j)
			found[m.Name()] += int(dp.IntValue())
			a := attrs(dp.Attributes())
			if m.Name() == DecisionsMetric {
				if a["mode"] != "shadow" || a["route"] != "acp_foreground" {
					t.Fatalf("decision attributes %v", a)
				}
				_, reason := a["reset_reason"]
				_, terminal := a["terminal_status"]
				if (a["decision"] == "reset") != reason || reason == terminal {
					t.Fatalf("decision attributes %v", a)
				}
				if _, ok := a["prompt_id"]; ok {
					t.Fatalf("prompt_id on a metric")
				}
			}
		}
	}
	if found[DecisionsMetric] != 4 || found[DiagnosticsMetric] != 4 || found[ObservationsMetric] != 6 {
		t.Fatalf("counts %v", found)
	}
	ld := Logs(out, time.Unix(300, 0))
	records := ld.ResourceLogs().At(0).ScopeLogs().At(0).LogRecords()
	names := []string{}
	for i := 0; i < records.Len(); i++ {
		lr := records.At(i)
		names = append(names, lr.EventName())
		if lr.ObservedTimestamp() == 0 || lr.Timestamp() == 0 {
			t.Fatalf("%s without both times", lr.EventName())
		}
		a := attrs(lr.Attributes())
		if lr.EventName() == TransitionEvent {
			_, typed := a["execution_error_type"]
			if typed != (a["decision"] != "reset") || a["prompt_id"] != "p" {
				t.Fatalf("transition attributes %v", a)
			}
			if lr.SeverityNumber() != plog.SeverityNumberInfo {
				t.Fatalf("severity %v", lr.SeverityNumber())
			}
		}
	}
	want := []string{TransitionEvent, TransitionEvent, LoopEvent, DiagnosticEvent, DiagnosticEvent}
	if len(names) != len(want) {
		t.Fatalf("records %v", names)
	}
	for i := range want {
		if names[i] != want[i] {
			t.Fatalf("records %v", names)
		}
	}
}
