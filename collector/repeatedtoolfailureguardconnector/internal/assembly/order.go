package assembly // import "github.com/otel-guard/otel-guard/collector/repeatedtoolfailureguardconnector/internal/assembly"

import (
	"sort"

	"go.opentelemetry.io/collector/pdata/pcommon"

	"github.com/otel-guard/otel-guard/collector/repeatedtoolfailureguardconnector/internal/spans"
)

// Event is a span's start or end, as a live process would have seen it.
type Event struct {
	Time  uint64
	IsEnd bool
	depth int
	index int
	Span  *spans.Span
}

type place struct {
	start uint64
	depth int
}

// Events orders the starts and ends of one trace's spans (given in the order read) as the
// Python replay does (otel_guard.replay.replayer._events): by time, starts before ends, then
// parents start first and children end first, then in the order read. A child cannot start
// before its parent: clock skew between hosts can say it did, and its start is moved to its
// parent's.
func Events(trace []*spans.Span, byID map[pcommon.SpanID]*spans.Span) []Event {
	placed := make(map[pcommon.SpanID]place, len(trace))
	parentOf := func(s *spans.Span) *spans.Span {
		if s.ParentID.IsEmpty() {
			return nil
		}
		p := byID[s.ParentID]
		if p == nil || p.SpanID.IsEmpty() {
			return nil
		}
		return p
	}
	var placeOf func(s *spans.Span) place
	placeOf = func(s *spans.Span) place {
		var chain []*spans.Span
		base := place{0, -1}
		seen := map[pcommon.SpanID]bool{}
		for cur := s; cur != nil && !cur.SpanID.IsEmpty(); cur = parentOf(cur) {
			if p, ok := placed[cur.SpanID]; ok {
				base = p
				break
			}
			if seen[cur.SpanID] {
				break // a parent cycle: malformed, but never loop forever
			}
			seen[cur.SpanID] = true
			chain = append(chain, cur)
		}
		start, depth := base.start, base.depth
		for i := len(chain) - 1; i >= 0; i-- {
			item := chain[i]
			if item.Start > start {
				start = item.Start
			}
			depth++
			placed[item.SpanID] = place{start, depth}
		}
		return place{start, depth}
	}
	events := make([]Event, 0, 2*len(trace))
	for i, s := range trace {
		var here place
		if s.SpanID.IsEmpty() {
			here = place{0, -1}
		} else if p, ok := placed[s.SpanID]; ok {
			here = p
		} else {
			here = placeOf(s)
		}
		end := s.End
		if end < here.start {
			end = here.start
		}
		events = append(events,
			Event{Time: here.start, depth: here.depth, index: i, Span: s},
			Event{Time: end, IsEnd: true, depth: -here.depth, index: i, Span: s})
	}
	sort.Slice(events, func(a, b int) bool {
		x, y := &events[a], &events[b]
		if c := compareEvents(x, y); c != 0 {
			return c < 0
		}
		return x.index < y.index
	})
	return events
}

// compareEvents orders two events by time, starts before ends, then parents start first and
// children end first (depth); 0 when none of these tells them apart.
func compareEvents(x, y *Event) int {
	if x.Time != y.Time {
		if x.Time < y.Time {
			return -1
		}
		return 1
	}
	if x.IsEnd != y.IsEnd {
		if !x.IsEnd {
			return -1
		}
		return 1
	}
	if x.depth != y.depth {
		if x.depth < y.depth {
			return -1
		}
		return 1
	}
	return 0
}
