// Package assembly turns the ordered starts and ends of ended spans into settled batches and
// prompts, runs the reducer per prompt, and reports what the Python GuardSpanProcessor would
// have reported on the same spans (otel_guard/guard/processor.py and
// otel_guard/spans/genai_profile.py): batches of section 3 from batch spans, batches inferred
// from model calls for the profiles of sections 3b and 3c, and the bounds of section 4.
//
// Each span is classified from the attributes it ended with, and a tool or model call belongs
// to the outermost prompt span above it in its trace, found through the parent chain whatever
// the order the spans ended in (docs/contract.md, [12-02]). As in otel_guard/spans/assembly.py,
// an inferred prompt is settled whole when its trace's local root ends: its batches are
// decided then, from the calls and model calls that had ended by that moment, and a span that
// ends after its local root is an orphan the guard never reads.
//
// Not safe for concurrent use: the connector calls it under its own lock.
package assembly // import "github.com/otel-guard/otel-guard/collector/repeatedtoolfailureguardconnector/internal/assembly"

import (
	"container/heap"
	"sort"

	"go.opentelemetry.io/collector/pdata/pcommon"

	"github.com/otel-guard/otel-guard/collector/repeatedtoolfailureguardconnector/internal/reducer"
	"github.com/otel-guard/otel-guard/collector/repeatedtoolfailureguardconnector/internal/spans"
	"github.com/otel-guard/otel-guard/collector/repeatedtoolfailureguardconnector/internal/telemetry"
)

// Bounds that are not configuration.
const (
	DefaultMaxCallsPerBatch = 1024
	endedBatches            = 4096
	maxDropped              = 4096
)

// Config bounds the guard and fixes what-if thresholds (analysis only: the connector runs the
// live constants).
type Config struct {
	MaxPrompts       int
	PromptTTLNanos   uint64
	MaxCallsPerBatch int
	Threshold        int
	BatchThreshold   int
}

// Evaluation is one batch the guard evaluated, for tests and benchmarks.
type Evaluation struct {
	PromptID string
	Profile  spans.Profile
	Before   reducer.State
	Input    reducer.Input
	Decision reducer.Decision
	Value    string
}

type prompt struct {
	guarded  bool
	state    reducer.State
	lastSeen uint64
}

type life struct {
	open    int
	guarded bool
}

type call struct {
	start   uint64
	end     uint64 // of an inferred call: a call still running when its batch settled is late
	arrival int
	obs     reducer.Observation
	spanID  pcommon.SpanID
	// missing: the span lacks an attribute section 3 requires of a tool-call span
	// (diagnostic missing_attribute when its batch ends, unless its prompt is off).
	missing bool
}

type openBatch struct {
	promptID string
	calls    []call
	overflow bool
	off      bool // the batch span itself marks its prompt as not guarded
}

// genaiPrompt is an inferred prompt (sections 3b, 3c) of one trace part: its outermost
// prompt span and the tool and model calls below it.
type genaiPrompt struct {
	id      string
	profile spans.Profile
	span    *spans.Span
	tools   []*spans.Span
	models  []*spans.Span
}

type spanKey struct {
	trace pcommon.TraceID
	span  pcommon.SpanID
}

// Guard is the guard's state across traces: prompts, the facts of dropped prompts, and the
// batch spans that ended recently.
type Guard struct {
	cfg     Config
	prompts *ordered[string, *prompt]
	idle    *ordered[string, struct{}]
	lives   map[string]*life
	dropped *ordered[string, bool]
	ended   *ordered[spanKey, string]
	// Inferred prompts settled, by ID: their prompt span's start and end, so that two open at
	// once with one ID are a collision (bounded, oldest first).
	settled *ordered[string, [2]uint64]

	// OnEvaluation, when set, receives every evaluated batch.
	OnEvaluation func(Evaluation)

	// Counts for tests and the benchmark.
	Prompts, Batches, Spans int

	out      telemetry.Output
	resource telemetry.Resource
}

// New returns a guard with no state.
func New(cfg Config) *Guard {
	if cfg.MaxCallsPerBatch <= 0 {
		cfg.MaxCallsPerBatch = DefaultMaxCallsPerBatch
	}
	if cfg.Threshold <= 0 {
		cfg.Threshold = reducer.Threshold
	}
	if cfg.BatchThreshold <= 0 {
		cfg.BatchThreshold = reducer.BatchThreshold
	}
	return &Guard{
		cfg:     cfg,
		prompts: newOrdered[string, *prompt](),
		idle:    newOrdered[string, struct{}](),
		lives:   map[string]*life{},
		dropped: newOrdered[string, bool](),
		ended:   newOrdered[spanKey, string](),
		settled: newOrdered[string, [2]uint64](),
	}
}

// TrackedPrompts is the number of prompts whose state is kept.
func (g *Guard) TrackedPrompts() int { return g.prompts.Len() }

func (g *Guard) diag(name, promptID string, trace pcommon.TraceID, span pcommon.SpanID) {
	g.out.Diagnostics = append(g.out.Diagnostics, telemetry.Diagnostic{
		Resource: g.resource, Name: name, PromptID: promptID, TraceID: trace, SpanID: span,
	})
}

// trace is the per-replay view of one trace part.
type trace struct {
	byID       map[pcommon.SpanID]*spans.Span
	kinds      map[*spans.Span]spans.Kind
	acpPrompts []*spans.Span // section 3 prompt spans, in the order read
	// the inferred prompts, by the index of the event that settles them
	settleAt   map[int][]*genaiPrompt
	batches    map[pcommon.SpanID]*openBatch
	promptSpan map[*spans.Span]string // acp prompt spans being tracked -> prompt ID
	// endAt is the index of each span's end event: what had ended before a prompt settled
	endAt map[*spans.Span]int
}

// Replay runs one trace part (its spans in the order read) through the guard and returns what
// it emitted.
func (g *Guard) Replay(part []*spans.Span) telemetry.Output {
	return g.ReplayMany([][]*spans.Span{part})
}

// ReplayMany runs trace parts ready together as one stream of events, in the order of their
// times (on a tie: starts before ends, by depth, then the earlier part first), and returns what
// the guard emitted. A section 3 prompt span and batch spans that are traces of their own are
// then seen as a live process saw them: the prompt span's start (and its opt-out) before its
// batches, its end after them. Parts that share a span ID (copies of one trace under other
// trace IDs) go one by one, in the order given, as the replay does.
func (g *Guard) ReplayMany(parts [][]*spans.Span) telemetry.Output {
	g.out = telemetry.Output{}
	if len(parts) > 1 && shareSpanIDs(parts) {
		for _, part := range parts {
			t, events := g.prepare(part)
			for i := range events {
				g.step(t, events, i)
			}
		}
	} else {
		cursors := make(cursorHeap, 0, len(parts))
		for order, part := range parts {
			t, events := g.prepare(part)
			if len(events) > 0 {
				cursors = append(cursors, &cursor{t: t, events: events, order: order})
			}
		}
		heap.Init(&cursors)
		for len(cursors) > 0 {
			c := cursors[0]
			g.step(c.t, c.events, c.next)
			c.next++
			if c.next == len(c.events) {
				heap.Pop(&cursors)
			} else {
				heap.Fix(&cursors, 0)
			}
		}
	}
	out := g.out
	g.out = telemetry.Output{}
	return out
}

// prepare reads one trace part: its spans by ID and kind, its events in order, and the lineage
// of its inferred prompts.
func (g *Guard) prepare(part []*spans.Span) (*trace, []Event) {
	g.Spans += len(part)
	t := &trace{
		byID:       make(map[pcommon.SpanID]*spans.Span, len(part)),
		kinds:      make(map[*spans.Span]spans.Kind, len(part)),
		settleAt:   map[int][]*genaiPrompt{},
		batches:    map[pcommon.SpanID]*openBatch{},
		promptSpan: map[*spans.Span]string{},
		endAt:      make(map[*spans.Span]int, len(part)),
	}
	for _, s := range part {
		if !s.SpanID.IsEmpty() {
			if _, dup := t.byID[s.SpanID]; !dup {
				t.byID[s.SpanID] = s
			}
		}
	}
	for _, s := range part {
		root := s.ParentID.IsEmpty() || s.RemoteParent
		t.kinds[s] = spans.Classify(s, root)
		if t.kinds[s] == spans.ACPPrompt {
			t.acpPrompts = append(t.acpPrompts, s)
		}
	}
	events := Events(part, t.byID)
	for i, ev := range events {
		if ev.IsEnd {
			t.endAt[ev.Span] = i
		}
	}
	g.lineage(t, part)
	return t, events
}

// step runs the i-th event of a trace part.
func (g *Guard) step(t *trace, events []Event, i int) {
	ev := events[i]
	g.resource = ev.Span.Resource
	if ev.IsEnd {
		g.end(t, ev)
		for _, p := range t.settleAt[i] {
			g.settlePrompt(t, p, i, ev.Time)
		}
	} else {
		g.start(t, ev)
	}
}

// shareSpanIDs reports whether two parts hold a span with the same span ID.
func shareSpanIDs(parts [][]*spans.Span) bool {
	seen := map[pcommon.SpanID]int{}
	for k, part := range parts {
		for _, s := range part {
			if s.SpanID.IsEmpty() {
				continue
			}
			if owner, ok := seen[s.SpanID]; ok && owner != k {
				return true
			}
			seen[s.SpanID] = k
		}
	}
	return false
}

// cursor is the next event of one trace part in a merged replay.
type cursor struct {
	t      *trace
	events []Event
	next   int
	order  int
}

// cursorHeap orders parts by their next event: time, starts before ends, depth, then part.
type cursorHeap []*cursor

func (h cursorHeap) Len() int { return len(h) }

func (h cursorHeap) Less(a, b int) bool {
	if c := compareEvents(&h[a].events[h[a].next], &h[b].events[h[b].next]); c != 0 {
		return c < 0
	}
	return h[a].order < h[b].order
}

func (h cursorHeap) Swap(a, b int) { h[a], h[b] = h[b], h[a] }

func (h *cursorHeap) Push(x any) { *h = append(*h, x.(*cursor)) }

func (h *cursorHeap) Pop() any {
	old := *h
	last := old[len(old)-1]
	*h = old[:len(old)-1]
	return last
}

func isInferredPrompt(k spans.Kind) bool { return k == spans.GenAIPrompt || k == spans.OIPrompt }

// lineage decides the GenAI and OpenInference prompts of the trace and the prompt of each of
// their calls: the outermost prompt span above a call, through ended ancestors; a subtree under
// a section 3 prompt or batch span is section 3's.
func (g *Guard) lineage(t *trace, part []*spans.Span) {
	prompts := map[*spans.Span]*genaiPrompt{}
	for _, s := range part {
		k := t.kinds[s]
		if k != spans.ModelCall && k != spans.GenAITool && !isInferredPrompt(k) {
			continue
		}
		if k == spans.GenAITool && s.HasACP {
			continue
		}
		var outer *spans.Span
		if isInferredPrompt(k) {
			outer = s
		}
		// Below a section 3 prompt span that is the local root, everything is section 3's (the
		// Python guard watches no such trace while that span is open), whatever ends when.
		root := localRoot(t, s)
		shielded := t.kinds[root] == spans.ACPPrompt
		seen := map[pcommon.SpanID]bool{s.SpanID: true}
		// The prompt settles when the local root ends; an ancestor that ends after it has left
		// no link by then (otel_guard reads ended spans), so lineage stops below it.
		settles := t.endAt[root]
		for cur := t.byID[s.ParentID]; !shielded && cur != nil && !seen[cur.SpanID]; cur = t.byID[cur.ParentID] {
			if t.endAt[cur] > settles {
				break
			}
			seen[cur.SpanID] = true
			ck := t.kinds[cur]
			if ck == spans.ACPPrompt || ck == spans.ACPBatch {
				shielded = true
				break
			}
			if isInferredPrompt(ck) {
				outer = cur
			}
		}
		if shielded || outer == nil {
			continue
		}
		if k != spans.ModelCall && k != spans.GenAITool && outer != s {
			continue // a nested prompt span: its outermost ancestor is the prompt
		}
		p := prompts[outer]
		if p == nil {
			profile := spans.ProfileGenAI
			if t.kinds[outer] == spans.OIPrompt {
				profile = spans.ProfileOpenInference
			}
			p = &genaiPrompt{id: spans.GenAIPromptID(outer, profile == spans.ProfileOpenInference), profile: profile, span: outer}
			prompts[outer] = p
		}
		switch k {
		case spans.ModelCall:
			p.models = append(p.models, s)
		case spans.GenAITool:
			p.tools = append(p.tools, s)
		}
	}
	// Each prompt settles when the local root above it ends (the prompt span itself when it is
	// the root), in the order the prompt spans ended; one that ended after its root never does.
	ordered := make([]*genaiPrompt, 0, len(prompts))
	for _, p := range prompts {
		ordered = append(ordered, p)
	}
	sort.Slice(ordered, func(i, j int) bool { return t.endAt[ordered[i].span] < t.endAt[ordered[j].span] })
	for _, p := range ordered {
		at := t.endAt[localRoot(t, p.span)]
		if t.endAt[p.span] <= at && !handedOver(t, p.span, at) {
			t.settleAt[at] = append(t.settleAt[at], p)
		}
	}
}

// localRoot is the span at the top of s's parent chain in this trace part: one without a
// parent, under a remote parent, or whose parent is not in the part.
func localRoot(t *trace, s *spans.Span) *spans.Span {
	seen := map[pcommon.SpanID]bool{s.SpanID: true}
	for !s.ParentID.IsEmpty() && !s.RemoteParent {
		parent := t.byID[s.ParentID]
		if parent == nil || seen[parent.SpanID] {
			break
		}
		seen[parent.SpanID] = true
		s = parent
	}
	return s
}

// handedOver: an inferred prompt span with a section 3 prompt span anywhere below it is the
// same host's prompt, read through its section 3 spans instead, as otel_guard/spans/assembly.py
// decides when the prompt settles (the end event at index at): the section 3 prompt span and
// every span between it and the prompt span had ended by then.
func handedOver(t *trace, s *spans.Span, at int) bool {
	for _, c := range t.acpPrompts {
		if t.endAt[c] >= at {
			continue
		}
		seen := map[pcommon.SpanID]bool{c.SpanID: true}
		for cur := c; !cur.ParentID.IsEmpty() && !cur.RemoteParent; {
			parent := t.byID[cur.ParentID]
			if parent == nil || seen[parent.SpanID] {
				break
			}
			if parent == s {
				return true
			}
			if t.endAt[parent] >= at {
				break // still open when the prompt settled: no link of it yet
			}
			seen[parent.SpanID] = true
			cur = parent
		}
	}
	return false
}

func (g *Guard) start(t *trace, ev Event) {
	s := ev.Span
	switch t.kinds[s] {
	case spans.ACPPrompt:
		id, long := g.promptID(s)
		g.startPrompt(s, id, ev.Time)
		t.promptSpan[s] = id
		if long && !spans.OptedOut(s) && !g.knownOff(id) {
			g.diag(telemetry.DiagLongPromptID, "", s.TraceID, s.SpanID)
		}
	case spans.ACPBatch:
		id, long := g.promptID(s)
		off := spans.OptedOut(s)
		if l := g.lives[id]; !off && l != nil && !l.guarded {
			// Inside an open prompt span that opted out, it stays off even if that span ends
			// first (section 3: no telemetry at all).
			off = true
		}
		b := &openBatch{promptID: id, off: off}
		t.batches[s.SpanID] = b
		if long && !g.batchOff(b) {
			g.diag(telemetry.DiagLongPromptID, "", s.TraceID, s.SpanID)
		}
	}
}

// acpCall: an execute_tool span whose parent is a batch span (open in this trace part, or
// ended recently) is a section 3 call.
func (g *Guard) acpCall(t *trace, s *spans.Span) bool {
	if !s.Operation.Set || s.Operation.Value != spans.ExecuteTool || s.ParentID.IsEmpty() {
		return false
	}
	if _, ok := t.batches[s.ParentID]; ok {
		return true
	}
	_, ok := g.ended.Get(spanKey{s.TraceID, s.ParentID})
	return ok
}

// promptID is a section 3 span's prompt ID, as its digest when it is longer than 256
// characters (long: diagnostic long_prompt_id unless the prompt is off; the ID itself is never
// named).
func (g *Guard) promptID(s *spans.Span) (id string, long bool) {
	id = spans.BoundedID(s.PromptID.Value)
	return id, id != s.PromptID.Value
}

// knownOff reports whether a fact kept of the prompt ID says it opted out: an opted-out
// prompt gets no telemetry at all, so no diagnostic about its spans is emitted.
func (g *Guard) knownOff(id string) bool {
	if p, ok := g.prompts.Get(id); ok && !p.guarded {
		return true
	}
	if l := g.lives[id]; l != nil && !l.guarded {
		return true
	}
	guarded, dropped := g.dropped.Get(id)
	return dropped && !guarded
}

// batchOff reports whether an open batch belongs to an opted-out prompt, as far as is known.
func (g *Guard) batchOff(b *openBatch) bool { return b.off || g.knownOff(b.promptID) }

func rebuilt() reducer.State {
	st := reducer.Initial()
	st.EnforcementDisabled = true
	return st
}

func (g *Guard) end(t *trace, ev Event) {
	s := ev.Span
	switch t.kinds[s] {
	case spans.ACPPrompt:
		if id, ok := t.promptSpan[s]; ok {
			delete(t.promptSpan, s)
			g.endPromptSpan(id)
		}
	case spans.ACPBatch:
		if b, ok := t.batches[s.SpanID]; ok {
			delete(t.batches, s.SpanID)
			g.endBatch(s, b, ev.Time)
		}
	case spans.GenAITool, spans.ACPTool:
		if g.acpCall(t, s) {
			g.keepCall(t, s)
		}
	}
}

func inferredObservation(s *spans.Span) reducer.Observation {
	callID, name, toolType, failed, errType := spans.InferredCall(s)
	status := "success"
	if failed {
		status = "error"
	}
	st := status
	return reducer.Observation{
		CallID: callID, PolicyToolName: name, ToolType: &toolType, TerminalStatus: status,
		ExecutionStatus: &st, ExecutionErrorType: errType,
	}
}

// -- section 3 -----------------------------------------------------------------------------

func (g *Guard) startPrompt(s *spans.Span, id string, now uint64) {
	guarded := !spans.OptedOut(s)
	g.Prompts++
	if l := g.lives[id]; l != nil {
		g.collide(id, l, guarded, s)
		l.open++
		return
	}
	l := &life{open: 1, guarded: guarded}
	g.lives[id] = l
	g.dropped.Delete(id)
	g.discard(id)
	g.admit(id, &prompt{guarded: guarded, state: reducer.Initial(), lastSeen: now}, now)
}

func (g *Guard) collide(id string, l *life, guarded bool, s *spans.Span) {
	l.guarded = l.guarded && guarded
	if p, ok := g.prompts.Get(id); ok {
		p.guarded = p.guarded && guarded
		p.state.EnforcementDisabled = true
	}
	if l.guarded { // an opted-out prompt gets no telemetry at all, diagnostics included
		g.diag(telemetry.DiagPromptCollision, id, s.TraceID, s.SpanID)
	}
}

func (g *Guard) endPromptSpan(id string) {
	if l := g.lives[id]; l != nil {
		l.open--
		if l.open > 0 {
			return
		}
		delete(g.lives, id)
	}
	g.discard(id)
}

func (g *Guard) keepCall(t *trace, s *spans.Span) {
	b, ok := t.batches[s.ParentID]
	if !ok {
		// An opted-out prompt has no telemetry ("": its batch ended off).
		if id, ended := g.ended.Get(spanKey{s.TraceID, s.ParentID}); ended && id != "" && !g.knownOff(id) {
			g.diag(telemetry.DiagLateSpan, id, s.TraceID, s.SpanID)
		}
		return
	}
	callID := ""
	if spans.UsableID(s.CallID) {
		callID = s.CallID.Value
	}
	var name *string
	if s.ToolName.Set && spans.Fits(s.ToolName.Value, spans.MaxToolNameLength) {
		name = s.ToolName.Ptr()
	}
	var toolType *string
	if s.ToolType.Set && (s.ToolType.Value == "native" || s.ToolType.Value == "mcp") {
		toolType = s.ToolType.Ptr()
	} else {
		// Not resolved from the host's registry: never eligible (section 3).
		name = nil
		if s.ToolType.Set && len(s.ToolType.Value) <= spans.MaxStatusLength {
			toolType = s.ToolType.Ptr()
		}
	}
	status := ""
	if s.Status.Set && len(s.Status.Value) <= spans.MaxStatusLength {
		status = s.Status.Value
	}
	var execution, errType *string
	if s.Execution.Set && len(s.Execution.Value) <= spans.MaxStatusLength {
		execution = s.Execution.Ptr()
	}
	if s.ExecErrorType.Set && len(s.ExecErrorType.Value) <= spans.MaxStatusLength {
		errType = s.ExecErrorType.Ptr()
	}
	if b.overflow {
		return
	}
	if len(b.calls) >= g.cfg.MaxCallsPerBatch {
		b.overflow = true
		if !g.batchOff(b) {
			g.diag(telemetry.DiagBatchOverflow, b.promptID, s.TraceID, s.SpanID)
		}
		return
	}
	named := s.ToolName.Set && spans.Fits(s.ToolName.Value, spans.MaxToolNameLength)
	missing := callID == "" || !named || !s.ToolType.Set || status == "" || execution == nil
	b.calls = append(b.calls, call{
		start: s.Start, arrival: len(b.calls), spanID: s.SpanID, missing: missing,
		obs: reducer.Observation{
			CallID: callID, PolicyToolName: name, ToolType: toolType, TerminalStatus: status,
			ExecutionStatus: execution, ExecutionErrorType: errType,
			ProviderDuplicate: s.ProviderDup.Set && s.ProviderDup.Value,
		},
	})
}

func sortCalls(calls []call) {
	sort.SliceStable(calls, func(i, j int) bool {
		if calls[i].start != calls[j].start {
			return calls[i].start < calls[j].start
		}
		return calls[i].arrival < calls[j].arrival
	})
}

func (g *Guard) promptForBatch(id string, now uint64) *prompt {
	if p, ok := g.prompts.Get(id); ok {
		p.lastSeen = now
		g.prompts.MoveToBack(id)
		return p
	}
	var p *prompt
	if l := g.lives[id]; l != nil {
		p = &prompt{guarded: l.guarded, state: rebuilt(), lastSeen: now}
	} else if guarded, ok := g.dropped.Delete(id); ok {
		p = &prompt{guarded: guarded, state: rebuilt(), lastSeen: now}
	} else {
		p = &prompt{guarded: true, state: reducer.Initial(), lastSeen: now}
	}
	g.admit(id, p, now)
	return p
}

func (g *Guard) endBatch(s *spans.Span, b *openBatch, now uint64) {
	g.ended.Set(spanKey{s.TraceID, s.SpanID}, b.promptID)
	if g.ended.Len() > endedBatches {
		k, _, _ := g.ended.Front()
		g.ended.Delete(k)
	}
	if !s.Admitted.Present {
		return // carried a prompt ID but is not a batch span
	}
	id := b.promptID
	optedOut := spans.OptedOut(s)
	key := spanKey{s.TraceID, s.SpanID}
	if b.off && !optedOut {
		// Started while its prompt was off (its prompt span open and opted out): off still,
		// though that span may have ended first and taken the prompt's facts with it.
		g.ended.Set(key, "") // its late calls are an off prompt's: no diagnostic
		return
	}
	if optedOut {
		if p, ok := g.prompts.Get(id); ok {
			p.guarded = false
		}
		if l := g.lives[id]; l != nil {
			l.guarded = false
		}
	}
	g.expire(now)
	p := g.promptForBatch(id, now)
	if optedOut {
		p.guarded = false
	}
	if !p.guarded {
		g.ended.Set(key, "") // its late calls are an off prompt's: no diagnostic
		return
	}
	calls := b.calls
	// Of two spans with one call ID, the one that ended first is the call (section 3: a second
	// terminal span for a call ID already seen is ignored); calls are in arrival order here.
	first := map[string]int{}
	for _, c := range calls {
		if _, seen := first[c.obs.CallID]; !c.obs.ProviderDuplicate && c.obs.CallID != "" && !seen {
			first[c.obs.CallID] = c.arrival
		}
	}
	sortCalls(calls)
	if !s.Reliable.Set || !s.Admitted.Set || s.Admitted.Value < 0 {
		// Half-written: the drain's reliability (missing means unreliable) or the count.
		g.diag(telemetry.DiagMissingAttribute, id, s.TraceID, s.SpanID)
	}
	for _, c := range calls {
		if c.missing {
			g.diag(telemetry.DiagMissingAttribute, id, s.TraceID, c.spanID)
		}
	}
	observations := make([]reducer.Observation, 0, len(calls))
	ids := map[string]bool{}
	wellFormed := true
	for _, c := range calls {
		if !c.obs.ProviderDuplicate {
			if c.obs.CallID == "" {
				wellFormed = false
				continue
			}
			if first[c.obs.CallID] != c.arrival {
				g.diag(telemetry.DiagDuplicateSpan, id, s.TraceID, c.spanID)
				continue
			}
			ids[c.obs.CallID] = true
		}
		observations = append(observations, c.obs)
	}
	complete := s.Admitted.Set && s.Admitted.Value >= 0 && !b.overflow && wellFormed && int64(len(ids)) == s.Admitted.Value
	input := reducer.Input{
		Mode:             reducer.ModeShadow,
		Batch:            reducer.Batch{Complete: complete, Observations: observations},
		HasExternalInput: s.External.Set && s.External.Value,
		HasQueuedPrompt:  s.Queued.Set && s.Queued.Value,
		InputReliable:    s.Reliable.Set && s.Reliable.Value,
	}
	g.decide(id, p, input, s, spans.ProfileACP)
}

// -- inferred batches (sections 3b, 3c) ----------------------------------------------------

// settlePrompt decides an inferred prompt whole, when its local root ended (the event at
// index at, at time now), as otel_guard/spans/assembly.py settles it and the processor reads
// its PromptStarted, BatchSettled and PromptEnded events.
func (g *Guard) settlePrompt(t *trace, gp *genaiPrompt, at int, now uint64) {
	var tools, models []call
	for _, s := range gp.tools {
		if t.endAt[s] < at {
			tools = append(tools, call{start: s.Start, end: endOf(s), arrival: t.endAt[s], spanID: s.SpanID, obs: inferredObservation(s)})
		}
	}
	for _, s := range gp.models {
		if t.endAt[s] < at {
			models = append(models, call{start: s.Start, arrival: t.endAt[s], spanID: s.SpanID})
		}
	}
	sortCalls(tools)
	sortCalls(models)
	g.Prompts++
	ps := gp.span
	g.resource = ps.Resource // the settling root may be another service's span
	// Two inferred prompt spans with one ID open at once (a conversation ID on concurrent
	// turns) collide; each is still decided on its own, as it settles whole.
	span := [2]uint64{ps.Start, endOf(ps)}
	if earlier, ok := g.settled.Delete(gp.id); ok && earlier[0] < span[1] && span[0] < earlier[1] {
		g.diag(telemetry.DiagPromptCollision, gp.id, pcommon.TraceID{}, pcommon.SpanID{})
	}
	g.settled.Set(gp.id, span)
	if g.settled.Len() > endedBatches {
		k, _, _ := g.settled.Front()
		g.settled.Delete(k)
	}
	collided := g.startInferred(gp.id, ps, now)
	byID := map[pcommon.SpanID]*spans.Span{}
	for _, s := range gp.models {
		byID[s.SpanID] = s
	}
	// Windows: the calls that started after one model call started and before the next did.
	windows := map[int][]call{}
	var order []int
	for _, c := range tools {
		i := sort.Search(len(models), func(i int) bool { return models[i].start > c.start })
		if _, ok := windows[i]; !ok {
			order = append(order, i)
		}
		windows[i] = append(windows[i], c)
	}
	sort.Ints(order)
	for _, i := range order {
		settler, settledAt := ps, endOf(ps)
		if i < len(models) {
			settler = byID[models[i].spanID]
			settledAt = settler.Start
		}
		complete := true
		seen := map[string]bool{}
		var observations []reducer.Observation
		for _, c := range windows[i] {
			if c.end > settledAt {
				complete = false // still running when its batch settled
				g.diag(telemetry.DiagLateSpan, gp.id, ps.TraceID, c.spanID)
				continue
			}
			if len(observations) >= g.cfg.MaxCallsPerBatch {
				if complete {
					g.diag(telemetry.DiagBatchOverflow, gp.id, ps.TraceID, c.spanID)
				}
				complete = false
				break
			}
			if seen[c.obs.CallID] {
				g.diag(telemetry.DiagDuplicateSpan, gp.id, ps.TraceID, c.spanID)
				continue
			}
			seen[c.obs.CallID] = true
			observations = append(observations, c.obs)
		}
		g.settleBatch(gp, settler, reducer.Batch{Complete: complete, Observations: observations}, now)
	}
	if !collided {
		g.discard(gp.id)
	}
}

// endOf is a span's end time, its start when it has none.
func endOf(s *spans.Span) uint64 {
	if s.End == 0 {
		return s.Start
	}
	return s.End
}

// startInferred starts an inferred prompt's state: a fresh one that never enforces, or, when
// state or an open prompt span of section 3 has its ID (or its state was dropped), that state
// with enforcement disabled, a collision. It reports whether the prompt collided.
func (g *Guard) startInferred(id string, s *spans.Span, now uint64) bool {
	l := g.lives[id]
	known, isKnown := g.prompts.Get(id)
	dropped, isDropped := g.dropped.Get(id)
	if l == nil && !isKnown && !isDropped {
		g.admit(id, &prompt{guarded: true, state: rebuilt(), lastSeen: now}, now)
		return false
	}
	if !isKnown {
		guarded := (l == nil || l.guarded) && (!isDropped || dropped)
		known = &prompt{guarded: guarded, state: rebuilt(), lastSeen: now}
		g.admit(id, known, now)
	}
	known.state.EnforcementDisabled = true
	if known.guarded { // an opted-out prompt gets no telemetry
		g.diag(telemetry.DiagPromptCollision, id, s.TraceID, s.SpanID)
	}
	return true
}

// settleBatch decides one inferred batch of a prompt, settled by the span s (the next model
// call, or the prompt span).
func (g *Guard) settleBatch(gp *genaiPrompt, s *spans.Span, batch reducer.Batch, now uint64) {
	p, ok := g.prompts.Get(gp.id)
	if !ok {
		p = &prompt{guarded: true, state: rebuilt(), lastSeen: now}
		g.admit(gp.id, p, now)
	} else {
		p.lastSeen = now
		g.prompts.MoveToBack(gp.id)
	}
	if !p.guarded {
		return
	}
	input := reducer.Input{Mode: reducer.ModeShadow, Batch: batch, InputReliable: true}
	g.decide(gp.id, p, input, s, gp.profile)
}

// -- the reducer and its telemetry ---------------------------------------------------------

func (g *Guard) decide(id string, p *prompt, input reducer.Input, s *spans.Span, profile spans.Profile) {
	g.Batches++
	before := p.state
	d := reducer.ReduceWithThresholds(before, input, g.cfg.Threshold, g.cfg.BatchThreshold)
	p.state = d.State
	if d.State.Phase == reducer.PhaseIdle {
		g.idle.Set(id, struct{}{})
		g.idle.MoveToBack(id)
	} else {
		g.idle.Delete(id)
	}
	tally := map[[2]string]int{}
	var order [][2]string
	for i := range input.Batch.Observations {
		o := &input.Batch.Observations[i]
		if o.ProviderDuplicate {
			continue // no execution: the reducer drops it, and the SLI counts executions
		}
		k := [2]string{telemetry.ObservationExecutionStatus(o.ExecutionStatus), telemetry.ObservationToolType(o.ToolType)}
		if tally[k] == 0 {
			order = append(order, k)
		}
		tally[k]++
	}
	for _, k := range order {
		g.out.Observations = append(g.out.Observations, telemetry.Observation{Resource: g.resource, ExecutionStatus: k[0], ToolType: k[1], Count: tally[k]})
	}
	value := telemetry.DecisionValue(d.Kind)
	if d.Kind == reducer.KindStop {
		value = "would_stop" // a collector takes no action: no reminder was ever delivered
	}
	if d.Kind == reducer.KindReset && d.Reason == reducer.ReasonContractViolation {
		g.diag(telemetry.DiagContractViolation, id, s.TraceID, s.SpanID)
	}
	if g.OnEvaluation != nil {
		g.OnEvaluation(Evaluation{PromptID: id, Profile: profile, Before: before, Input: input, Decision: d, Value: value})
	}
	if value == "" {
		return
	}
	candidate := d.State
	if value == "reset" {
		candidate = before
	}
	tr := telemetry.Transition{
		Resource: g.resource, PromptID: id, PhaseBefore: before.Phase, PhaseAfter: d.State.Phase,
		Decision: value, FailureCount: candidate.FailureCount, BatchCount: candidate.BatchCount,
		CandidateOrdinal: candidate.CandidateOrdinal, ResetReason: d.Reason,
		TraceID: s.TraceID, SpanID: s.SpanID, Timestamp: pcommon.Timestamp(s.End),
	}
	if key := d.State.Key; key != nil {
		tr.ExecutionErrorType = key.ExecutionErrorType
		if value != "reset" {
			for _, o := range input.Batch.Observations {
				if !o.ProviderDuplicate && o.PolicyToolName != nil && *o.PolicyToolName == key.PolicyToolName &&
					o.ExecutionErrorType != nil && *o.ExecutionErrorType == key.ExecutionErrorType {
					if o.ToolType != nil {
						tr.ToolType = *o.ToolType
					}
					break
				}
			}
		}
	}
	g.out.Transitions = append(g.out.Transitions, tr)
}

// -- prompt bounds (section 4) -------------------------------------------------------------

func (g *Guard) discard(id string) {
	if _, ok := g.prompts.Delete(id); ok {
		g.idle.Delete(id)
	}
}

func (g *Guard) admit(id string, p *prompt, now uint64) {
	g.expire(now)
	if g.prompts.Len() >= g.cfg.MaxPrompts {
		victim, _, ok := g.idle.Front()
		if !ok {
			victim, _, _ = g.prompts.Front()
		}
		g.drop(victim, telemetry.DiagEvicted)
	}
	g.prompts.Set(id, p)
	if p.state.Phase == reducer.PhaseIdle {
		g.idle.Set(id, struct{}{})
	}
}

func (g *Guard) expire(now uint64) {
	for {
		id, p, ok := g.prompts.Front()
		if !ok || now < p.lastSeen || now-p.lastSeen < g.cfg.PromptTTLNanos {
			return
		}
		g.drop(id, telemetry.DiagExpired)
	}
}

func (g *Guard) drop(id, diagnostic string) {
	p, ok := g.prompts.Delete(id)
	if !ok {
		return
	}
	g.idle.Delete(id)
	if l := g.lives[id]; l != nil {
		l.guarded = l.guarded && p.guarded
	} else {
		g.dropped.Set(id, p.guarded)
		g.dropped.MoveToBack(id)
		if g.dropped.Len() > maxDropped {
			k, _, _ := g.dropped.Front()
			g.dropped.Delete(k)
		}
	}
	if p.guarded { // an opted-out prompt gets no telemetry at all, diagnostics included
		g.diag(diagnostic, id, pcommon.TraceID{}, pcommon.SpanID{})
	}
}
