// Package telemetry holds the names of docs/contract.md section 5 and turns the guard's
// transitions, diagnostics and observations into OTLP metrics and log records, grouped by the
// input resource's service.version and deployment.environment.name.
package telemetry // import "github.com/otel-guard/otel-guard/collector/repeatedtoolfailureguardconnector/internal/telemetry"

import (
	"sort"
	"strings"
	"time"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/pmetric"
)

// Names of section 5.
const (
	ScopeName          = "otel_guard"
	DecisionsMetric    = "acp.repeated_tool_failure_guard.decisions"
	DiagnosticsMetric  = "acp.repeated_tool_failure_guard.diagnostics"
	ObservationsMetric = "acp.repeated_tool_failure_guard.observations"
	TransitionEvent    = "acp.repeated_tool_failure_guard.transition"
	DiagnosticEvent    = "acp.repeated_tool_failure_guard.diagnostic"
	LoopEvent          = "acp.loop_detected"
	LoopType           = "repeated_tool_execution_failure"
	Route              = "acp_foreground"
	// Mode is the only mode a collector can have: it never takes an action for a host.
	Mode = "shadow"
)

// Diagnostics (the closed set of section 5).
const (
	DiagInvalidMode       = "invalid_mode"
	DiagLateSpan          = "late_span"
	DiagDuplicateSpan     = "duplicate_span"
	DiagBatchOverflow     = "batch_overflow"
	DiagEvicted           = "evicted"
	DiagExpired           = "expired"
	DiagInternalError     = "internal_error"
	DiagTelemetryError    = "telemetry_error"
	DiagContractViolation = "contract_violation"
	DiagPromptCollision   = "prompt_collision"
	DiagLongPromptID      = "long_prompt_id"
	DiagMissingAttribute  = "missing_attribute"
)

// Diagnostics lists the closed set of diagnostic values.
var Diagnostics = []string{
	DiagInvalidMode, DiagLateSpan, DiagDuplicateSpan, DiagBatchOverflow, DiagEvicted, DiagExpired,
	DiagInternalError, DiagTelemetryError, DiagContractViolation, DiagPromptCollision,
	DiagLongPromptID, DiagMissingAttribute,
}

// The resource attributes carried from the input.
const (
	ServiceVersion        = "service.version"
	DeploymentEnvironment = "deployment.environment.name"
)

// Resource is the part of an input resource the guard's output carries.
type Resource struct {
	ServiceVersion        string
	DeploymentEnvironment string
}

// DecisionValue maps a reducer kind to the section 5 decision value ("" for none).
func DecisionValue(kind string) string {
	switch kind {
	case "reset", "tracked", "would_warn", "would_stop":
		return kind
	case "warn":
		return "warned"
	case "stop":
		return "stopped"
	}
	return ""
}

// FailureCountBucket is the failure_count_bucket of a count.
func FailureCountBucket(n int) string {
	switch {
	case n <= 0:
		return "0"
	case n <= 2:
		return "1-2"
	case n <= 4:
		return "3-4"
	case n <= 7:
		return "5-7"
	}
	return "8+"
}

// BatchCountBucket is the batch_count_bucket of a count.
func BatchCountBucket(n int) string {
	switch {
	case n <= 0:
		return "0"
	case n == 1:
		return "1"
	case n == 2:
		return "2"
	}
	return "3+"
}

// Transition is one guard transition, reduced to what may leave the process.
type Transition struct {
	Resource           Resource
	PromptID           string
	PhaseBefore        string
	PhaseAfter         string
	Decision           string // a section 5 decision value
	FailureCount       int
	BatchCount         int
	CandidateOrdinal   int
	ResetReason        string // only for reset
	ToolType           string // native or mcp, else empty
	ExecutionErrorType string
	TraceID            pcommon.TraceID
	SpanID             pcommon.SpanID
	Timestamp          pcommon.Timestamp
}

// Diagnostic is one counted diagnostic, with the prompt it concerns when one applies.
type Diagnostic struct {
	Resource Resource
	Name     string
	PromptID string
	TraceID  pcommon.TraceID
	SpanID   pcommon.SpanID
}

// Observation counts the observations of evaluated batches by their closed attributes.
type Observation struct {
	Resource        Resource
	ExecutionStatus string
	ToolType        string
	Count           int
}

// Output is what one step of the guard produced, in order.
type Output struct {
	Transitions  []Transition
	Diagnostics  []Diagnostic
	Observations []Observation
}

// Empty reports whether there is nothing to emit.
func (o *Output) Empty() bool {
	return len(o.Transitions) == 0 && len(o.Diagnostics) == 0 && len(o.Observations) == 0
}

// Append adds other's items after o's.
func (o *Output) Append(other Output) {
	o.Transitions = append(o.Transitions, other.Transitions...)
	o.Diagnostics = append(o.Diagnostics, other.Diagnostics...)
	o.Observations = append(o.Observations, other.Observations...)
}

var toolTypes = map[string]bool{"native": true, "mcp": true}

var executionStatuses = map[string]bool{"success": true, "error": true, "cancelled": true, "not_started": true, "unknown": true}

// ObservationExecutionStatus maps a span's execution status (nil: missing) to its closed value.
func ObservationExecutionStatus(status *string) string {
	if status != nil && executionStatuses[*status] {
		return *status
	}
	return "unknown"
}

// ObservationToolType maps a span's tool type (nil: missing) to its closed value.
func ObservationToolType(toolType *string) string {
	if toolType != nil && toolTypes[*toolType] {
		return *toolType
	}
	return "other"
}

// MetricAttributes are the decisions counter's attributes of a transition, as key/value pairs
// in a fixed order.
func (t *Transition) MetricAttributes() [][2]string {
	attrs := [][2]string{
		{"route", Route},
		{"mode", Mode},
		{"phase_before", t.PhaseBefore},
		{"phase_after", t.PhaseAfter},
		{"decision", t.Decision},
		{"failure_count_bucket", FailureCountBucket(t.FailureCount)},
		{"batch_count_bucket", BatchCountBucket(t.BatchCount)},
	}
	if t.Decision == "reset" {
		if t.ResetReason != "" {
			attrs = append(attrs, [2]string{"reset_reason", t.ResetReason})
		}
	} else {
		attrs = append(attrs, [2]string{"terminal_status", "error"}, [2]string{"execution_status", "error"})
		if toolTypes[t.ToolType] {
			attrs = append(attrs, [2]string{"tool_type", t.ToolType})
		}
	}
	return attrs
}

type series struct {
	resource Resource
	metric   string
	attrs    [][2]string
}

func seriesKey(r Resource, metric string, attrs [][2]string) string {
	var b strings.Builder
	b.WriteString(r.ServiceVersion)
	b.WriteByte(0)
	b.WriteString(r.DeploymentEnvironment)
	b.WriteByte(0)
	b.WriteString(metric)
	for _, kv := range attrs {
		b.WriteByte(0)
		b.WriteString(kv[0])
		b.WriteByte(1)
		b.WriteString(kv[1])
	}
	return b.String()
}

// Counters accumulates the three counters as cumulative monotonic sums, as an SDK meter
// would: every export carries the totals since the start time.
type Counters struct {
	start  pcommon.Timestamp
	series map[string]*series
	values map[string]int64
}

// NewCounters returns empty counters whose sums start at start.
func NewCounters(start time.Time) *Counters {
	return &Counters{start: pcommon.NewTimestampFromTime(start), series: map[string]*series{}, values: map[string]int64{}}
}

func (c *Counters) add(r Resource, metric string, attrs [][2]string, n int) {
	key := seriesKey(r, metric, attrs)
	if _, ok := c.series[key]; !ok {
		c.series[key] = &series{resource: r, metric: metric, attrs: attrs}
	}
	c.values[key] += int64(n)
}

// Add counts out.
func (c *Counters) Add(out Output) {
	for i := range out.Transitions {
		t := &out.Transitions[i]
		c.add(t.Resource, DecisionsMetric, t.MetricAttributes(), 1)
	}
	for _, d := range out.Diagnostics {
		c.add(d.Resource, DiagnosticsMetric, [][2]string{{"diagnostic", d.Name}}, 1)
	}
	for _, o := range out.Observations {
		c.add(o.Resource, ObservationsMetric, [][2]string{{"execution_status", o.ExecutionStatus}, {"tool_type", o.ToolType}}, o.Count)
	}
}

// Len is the number of series.
func (c *Counters) Len() int { return len(c.series) }

var units = map[string]string{DecisionsMetric: "{decision}", DiagnosticsMetric: "{diagnostic}", ObservationsMetric: "{call}"}

var descriptions = map[string]string{
	DecisionsMetric:    "Repeated-tool-failure guard transitions (reducer decisions other than none).",
	DiagnosticsMetric:  "Repeated-tool-failure guard diagnostics.",
	ObservationsMetric: "Tool calls of batches the repeated-tool-failure guard evaluated.",
}

func putResource(r Resource, res pcommon.Resource) {
	if r.ServiceVersion != "" {
		res.Attributes().PutStr(ServiceVersion, r.ServiceVersion)
	}
	if r.DeploymentEnvironment != "" {
		res.Attributes().PutStr(DeploymentEnvironment, r.DeploymentEnvironment)
	}
}

// Metrics builds the totals as OTLP metrics at time now: one resource per input resource
// group, scope otel_guard, one monotonic cumulative sum per counter.
func (c *Counters) Metrics(now time.Time) pmetric.Metrics {
	md := pmetric.NewMetrics()
	keys := make([]string, 0, len(c.series))
	for k := range c.series {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	ts := pcommon.NewTimestampFromTime(now)
	scopes := map[Resource]pmetric.ScopeMetrics{}
	metrics := map[Resource]map[string]pmetric.Sum{}
	for _, k := range keys {
		s := c.series[k]
		sm, ok := scopes[s.resource]
		if !ok {
			rm := md.ResourceMetrics().AppendEmpty()
			putResource(s.resource, rm.Resource())
			sm = rm.ScopeMetrics().AppendEmpty()
			sm.Scope().SetName(ScopeName)
			scopes[s.resource] = sm
			metrics[s.resource] = map[string]pmetric.Sum{}
		}
		sum, ok := metrics[s.resource][s.metric]
		if !ok {
			m := sm.Metrics().AppendEmpty()
			m.SetName(s.metric)
			m.SetUnit(units[s.metric])
			m.SetDescription(descriptions[s.metric])
			sum = m.SetEmptySum()
			sum.SetIsMonotonic(true)
			sum.SetAggregationTemporality(pmetric.AggregationTemporalityCumulative)
			metrics[s.resource][s.metric] = sum
		}
		dp := sum.DataPoints().AppendEmpty()
		dp.SetStartTimestamp(c.start)
		dp.SetTimestamp(ts)
		dp.SetIntValue(c.values[k])
		for _, kv := range s.attrs {
			dp.Attributes().PutStr(kv[0], kv[1])
		}
	}
	return md
}

// Logs builds the log records of out at observed time now: one transition record per
// transition (and a loop event for stopped), one diagnostic record per diagnostic.
func Logs(out Output, now time.Time) plog.Logs {
	ld := plog.NewLogs()
	observed := pcommon.NewTimestampFromTime(now)
	scopes := map[Resource]plog.ScopeLogs{}
	scopeOf := func(r Resource) plog.ScopeLogs {
		sl, ok := scopes[r]
		if !ok {
			rl := ld.ResourceLogs().AppendEmpty()
			putResource(r, rl.Resource())
			sl = rl.ScopeLogs().AppendEmpty()
			sl.Scope().SetName(ScopeName)
			scopes[r] = sl
		}
		return sl
	}
	for i := range out.Transitions {
		t := &out.Transitions[i]
		sl := scopeOf(t.Resource)
		lr := sl.LogRecords().AppendEmpty()
		lr.SetEventName(TransitionEvent)
		lr.SetSeverityNumber(plog.SeverityNumberInfo)
		lr.SetSeverityText("INFO")
		ts := t.Timestamp
		if ts == 0 {
			ts = observed
		}
		lr.SetTimestamp(ts)
		lr.SetObservedTimestamp(observed)
		lr.SetTraceID(t.TraceID)
		lr.SetSpanID(t.SpanID)
		for _, kv := range t.MetricAttributes() {
			lr.Attributes().PutStr(kv[0], kv[1])
		}
		lr.Attributes().PutStr("prompt_id", t.PromptID)
		lr.Attributes().PutInt("candidate_ordinal", int64(t.CandidateOrdinal))
		if t.Decision != "reset" && t.ExecutionErrorType != "" {
			lr.Attributes().PutStr("execution_error_type", t.ExecutionErrorType)
		}
		if t.Decision == "stopped" {
			loop := sl.LogRecords().AppendEmpty()
			loop.SetEventName(LoopEvent)
			loop.SetSeverityNumber(plog.SeverityNumberWarn)
			loop.SetSeverityText("WARN")
			loop.SetTimestamp(ts)
			loop.SetObservedTimestamp(observed)
			loop.SetTraceID(t.TraceID)
			loop.SetSpanID(t.SpanID)
			loop.Attributes().PutStr("loop_type", LoopType)
			loop.Attributes().PutStr("prompt_id", t.PromptID)
		}
	}
	for _, d := range out.Diagnostics {
		lr := scopeOf(d.Resource).LogRecords().AppendEmpty()
		lr.SetEventName(DiagnosticEvent)
		lr.SetSeverityNumber(plog.SeverityNumberWarn)
		lr.SetSeverityText("WARN")
		lr.SetTimestamp(observed)
		lr.SetObservedTimestamp(observed)
		lr.SetTraceID(d.TraceID)
		lr.SetSpanID(d.SpanID)
		lr.Attributes().PutStr("diagnostic", d.Name)
		if d.PromptID != "" {
			lr.Attributes().PutStr("prompt_id", d.PromptID)
		}
	}
	return ld
}
