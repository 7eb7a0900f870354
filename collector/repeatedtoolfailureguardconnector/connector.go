package repeatedtoolfailureguardconnector // import "github.com/otel-guard/otel-guard/collector/repeatedtoolfailureguardconnector"

import (
	"context"
	"errors"
	"sort"
	"sync"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/connector"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.uber.org/zap"

	"github.com/otel-guard/otel-guard/collector/repeatedtoolfailureguardconnector/internal/assembly"
	"github.com/otel-guard/otel-guard/collector/repeatedtoolfailureguardconnector/internal/spans"
	"github.com/otel-guard/otel-guard/collector/repeatedtoolfailureguardconnector/internal/telemetry"
)

// Spans of traces replayed recently are remembered by ID, so that a span exported twice is
// replayed once (diagnostic duplicate_span) and a late part of a trace is told apart from it.
const rememberedSpans = 1 << 16

// Traces replayed recently are remembered by ID, so that a part of one that arrives after it was
// replayed (more than wait after its last span) is counted once as a late_span diagnostic: it is
// replayed on its own, and its decisions may differ from those of the whole trace.
const rememberedTraces = 1 << 14

// emitter sends what the guard produced to the next consumer of one signal.
type emitter interface {
	emit(ctx context.Context, out telemetry.Output, now time.Time) error
	capabilities() consumer.Capabilities
}

type metricsEmitter struct {
	next     consumer.Metrics
	counters *telemetry.Counters
}

func (m *metricsEmitter) emit(ctx context.Context, out telemetry.Output, now time.Time) error {
	if m.counters == nil {
		m.counters = telemetry.NewCounters(now)
	}
	m.counters.Add(out)
	if m.counters.Len() == 0 {
		return nil
	}
	return m.next.ConsumeMetrics(ctx, m.counters.Metrics(now))
}

func (m *metricsEmitter) capabilities() consumer.Capabilities { return consumer.Capabilities{} }

type logsEmitter struct {
	next consumer.Logs
}

func (l *logsEmitter) emit(ctx context.Context, out telemetry.Output, now time.Time) error {
	if len(out.Transitions) == 0 && len(out.Diagnostics) == 0 {
		return nil
	}
	return l.next.ConsumeLogs(ctx, telemetry.Logs(out, now))
}

func (l *logsEmitter) capabilities() consumer.Capabilities { return consumer.Capabilities{} }

// bufferedTrace is a trace's spans awaiting their wait window, in the order they arrived.
type bufferedTrace struct {
	id    pcommon.TraceID
	spans []*spans.Span
	ids   map[pcommon.SpanID]bool
	start uint64
	last  time.Time
	bytes int
}

type spanRef struct {
	trace pcommon.TraceID
	span  pcommon.SpanID
}

// guardConnector buffers each trace's spans until `wait` has passed since its last span, then
// orders them as a live process would have seen them and runs them through the guard. The
// metrics and the logs pipelines each get their own instance, and each runs the same guard
// on the same spans, so both see the same decisions.
type guardConnector struct {
	cfg    *Config
	logger *zap.Logger
	out    emitter
	now    func() time.Time

	mu        sync.Mutex
	guard     *assembly.Guard
	traces    map[pcommon.TraceID]*bufferedTrace
	bytes     int
	replayed  map[spanRef]struct{}
	replayedQ []spanRef
	// Traces replayed recently, oldest first.
	replayedTraces  map[pcommon.TraceID]struct{}
	replayedTracesQ []pcommon.TraceID
	pending         telemetry.Output

	emitMu  sync.Mutex
	stop    chan struct{}
	done    chan struct{}
	started bool
}

var _ connector.Traces = (*guardConnector)(nil)

func newConnector(set connector.Settings, cfg *Config, out emitter) (*guardConnector, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &guardConnector{
		cfg:    cfg,
		logger: set.Logger,
		out:    out,
		now:    time.Now,
		guard: assembly.New(assembly.Config{
			MaxPrompts:     cfg.MaxPrompts,
			PromptTTLNanos: uint64(cfg.PromptTTL.Nanoseconds()),
		}),
		traces:         map[pcommon.TraceID]*bufferedTrace{},
		replayed:       map[spanRef]struct{}{},
		replayedTraces: map[pcommon.TraceID]struct{}{},
	}, nil
}

func (c *guardConnector) Capabilities() consumer.Capabilities { return c.out.capabilities() }

// Start starts the ticker that replays the traces whose wait window has passed.
func (c *guardConnector) Start(context.Context, component.Host) error {
	c.stop = make(chan struct{})
	c.done = make(chan struct{})
	c.started = true
	interval := c.cfg.Wait / 4
	if interval < 5*time.Millisecond {
		interval = 5 * time.Millisecond
	}
	if interval > time.Second {
		interval = time.Second
	}
	go c.tick(interval)
	return nil
}

func (c *guardConnector) tick(interval time.Duration) {
	defer close(c.done)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
			if err := c.flush(context.Background(), false); err != nil {
				c.logger.Warn("repeated_tool_failure_guard: emitting the guard's telemetry failed", zap.Error(err))
			}
		}
	}
}

// Shutdown stops the ticker and replays every trace still buffered, emitting what it gives.
func (c *guardConnector) Shutdown(ctx context.Context) error {
	if c.started {
		close(c.stop)
		<-c.done
		c.started = false
	}
	return c.flush(ctx, true)
}

// ConsumeTraces buffers the spans per trace. It never fails on a span it cannot read: a span
// the guard has no use for is still buffered (it may be an ancestor the lineage goes through).
func (c *guardConnector) ConsumeTraces(ctx context.Context, td ptrace.Traces) error {
	now := c.now()
	c.mu.Lock()
	rss := td.ResourceSpans()
	for i := 0; i < rss.Len(); i++ {
		rs := rss.At(i)
		resource := spans.ResourceOf(rs.Resource())
		sss := rs.ScopeSpans()
		for j := 0; j < sss.Len(); j++ {
			ss := sss.At(j).Spans()
			for k := 0; k < ss.Len(); k++ {
				c.add(spans.Read(ss.At(k), resource), now)
			}
		}
	}
	var over bool
	if c.bytes > c.cfg.MaxCallBytes {
		over = true
	}
	c.mu.Unlock()
	if over {
		return c.shed(ctx)
	}
	return nil
}

func (c *guardConnector) add(s *spans.Span, now time.Time) {
	ref := spanRef{s.TraceID, s.SpanID}
	if _, seen := c.replayed[ref]; seen {
		// At-least-once export repeats spans already replayed.
		c.pending.Diagnostics = append(c.pending.Diagnostics, telemetry.Diagnostic{Resource: s.Resource, Name: telemetry.DiagDuplicateSpan, TraceID: s.TraceID, SpanID: s.SpanID})
		return
	}
	t := c.traces[s.TraceID]
	if t == nil {
		t = &bufferedTrace{id: s.TraceID, ids: map[pcommon.SpanID]bool{}, start: s.Start}
		c.traces[s.TraceID] = t
		if _, late := c.replayedTraces[s.TraceID]; late {
			// A part of a trace already replayed: said once, when the part starts.
			c.pending.Diagnostics = append(c.pending.Diagnostics, telemetry.Diagnostic{Resource: s.Resource, Name: telemetry.DiagLateSpan, TraceID: s.TraceID, SpanID: s.SpanID})
		}
	}
	if t.ids[s.SpanID] {
		c.pending.Diagnostics = append(c.pending.Diagnostics, telemetry.Diagnostic{Resource: s.Resource, Name: telemetry.DiagDuplicateSpan, TraceID: s.TraceID, SpanID: s.SpanID})
		return
	}
	t.ids[s.SpanID] = true
	t.spans = append(t.spans, s)
	if s.Start < t.start {
		t.start = s.Start
	}
	t.last = now
	t.bytes += s.Size
	c.bytes += s.Size
}

// shed replays the traces that have waited longest until the buffer is back under its bound.
func (c *guardConnector) shed(ctx context.Context) error {
	c.mu.Lock()
	var ready []*bufferedTrace
	if c.bytes > c.cfg.MaxCallBytes {
		all := make([]*bufferedTrace, 0, len(c.traces))
		for _, t := range c.traces {
			all = append(all, t)
		}
		sort.Slice(all, func(i, j int) bool { return all[i].last.Before(all[j].last) })
		for _, t := range all {
			if c.bytes <= c.cfg.MaxCallBytes/2 {
				break
			}
			ready = append(ready, t)
			c.bytes -= t.bytes
			delete(c.traces, t.id)
		}
	}
	out := c.replay(ready)
	c.mu.Unlock()
	return c.send(ctx, out)
}

// flush replays the traces whose wait window has passed (every trace when all is set).
func (c *guardConnector) flush(ctx context.Context, all bool) error {
	now := c.now()
	c.mu.Lock()
	var ready []*bufferedTrace
	for id, t := range c.traces {
		if all || now.Sub(t.last) >= c.cfg.Wait {
			ready = append(ready, t)
			c.bytes -= t.bytes
			delete(c.traces, id)
		}
	}
	out := c.replay(ready)
	c.mu.Unlock()
	return c.send(ctx, out)
}

// replay runs traces through the guard, those ready together as one stream of events in the
// order of their times (a prompt span and batch spans that are traces of their own are then
// seen as a live process saw them; on a tie the earlier-started trace goes first); under mu.
func (c *guardConnector) replay(ready []*bufferedTrace) telemetry.Output {
	sort.SliceStable(ready, func(i, j int) bool {
		if ready[i].start != ready[j].start {
			return ready[i].start < ready[j].start
		}
		return string(ready[i].id[:]) < string(ready[j].id[:])
	})
	out := c.pending
	c.pending = telemetry.Output{}
	parts := make([][]*spans.Span, len(ready))
	for i, t := range ready {
		parts[i] = t.spans
	}
	out.Append(c.safeReplay(parts))
	for _, t := range ready {
		c.remember(t)
	}
	return out
}

// safeReplay never lets a malformed trace take the collector down: a panic in the guard is
// an internal_error diagnostic, and the traces replayed with it are skipped.
func (c *guardConnector) safeReplay(parts [][]*spans.Span) (out telemetry.Output) {
	defer func() {
		if r := recover(); r != nil {
			c.logger.Debug("repeated_tool_failure_guard: internal error")
			out = telemetry.Output{Diagnostics: []telemetry.Diagnostic{{Name: telemetry.DiagInternalError}}}
		}
	}()
	return c.guard.ReplayMany(parts)
}

func (c *guardConnector) remember(t *bufferedTrace) {
	if _, known := c.replayedTraces[t.id]; !known {
		c.replayedTraces[t.id] = struct{}{}
		c.replayedTracesQ = append(c.replayedTracesQ, t.id)
		if len(c.replayedTracesQ) > rememberedTraces {
			delete(c.replayedTraces, c.replayedTracesQ[0])
			c.replayedTracesQ = c.replayedTracesQ[1:]
		}
		if cap(c.replayedTracesQ) > 4*rememberedTraces {
			c.replayedTracesQ = append([]pcommon.TraceID(nil), c.replayedTracesQ...)
		}
	}
	for _, s := range t.spans {
		ref := spanRef{s.TraceID, s.SpanID}
		c.replayed[ref] = struct{}{}
		c.replayedQ = append(c.replayedQ, ref)
	}
	for len(c.replayedQ) > rememberedSpans {
		delete(c.replayed, c.replayedQ[0])
		c.replayedQ = c.replayedQ[1:]
	}
	if cap(c.replayedQ) > 4*rememberedSpans {
		c.replayedQ = append([]spanRef(nil), c.replayedQ...)
	}
}

func (c *guardConnector) send(ctx context.Context, out telemetry.Output) error {
	if out.Empty() {
		return nil
	}
	c.emitMu.Lock()
	defer c.emitMu.Unlock()
	err := c.out.emit(ctx, out, c.now())
	if err != nil {
		// Counted, never retried into a decision: telemetry failures change nothing. A failed
		// telemetry_error record is not counted again, or a consumer that keeps failing would
		// make one more at every tick (as the Python guard, which never reports its own report).
		if !onlyTelemetryErrors(out) {
			c.mu.Lock()
			c.pending.Diagnostics = append(c.pending.Diagnostics, telemetry.Diagnostic{Name: telemetry.DiagTelemetryError})
			c.mu.Unlock()
		}
		return errors.Join(errors.New("repeated_tool_failure_guard: emitting telemetry"), err)
	}
	return nil
}

// onlyTelemetryErrors reports whether out holds telemetry_error diagnostics and nothing else.
func onlyTelemetryErrors(out telemetry.Output) bool {
	if len(out.Transitions) != 0 || len(out.Observations) != 0 {
		return false
	}
	for _, d := range out.Diagnostics {
		if d.Name != telemetry.DiagTelemetryError {
			return false
		}
	}
	return true
}
