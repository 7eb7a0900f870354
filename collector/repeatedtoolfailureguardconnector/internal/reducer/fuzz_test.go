package reducer

import "testing"

var (
	fuzzTools      = []string{"read_file", "grep", "", " "}
	fuzzTerminals  = []string{"error", "success", "cancelled", "timeout"}
	fuzzExecutions = []string{"error", "success", "not_started", "cancelled", "unknown", "x"}
	fuzzErrorTypes = []string{"enoent", "eacces", "unknown", "Bad", ""}
	fuzzModes      = []string{"shadow", "warn", "enforce", "off", "junk"}
)

func pick(list []string, b byte) *string {
	i := int(b) % (len(list) + 1)
	if i == len(list) {
		return nil
	}
	v := list[i]
	return &v
}

// decodeInputs turns fuzz bytes into a sequence of inputs: each batch takes a header byte
// (mode, completeness, drain flags) and up to four observations of four bytes each.
func decodeInputs(data []byte) []Input {
	var inputs []Input
	for len(data) > 0 {
		h := data[0]
		data = data[1:]
		n := int(h>>5) % 5
		in := Input{
			Mode:             fuzzModes[int(h)%len(fuzzModes)],
			HasExternalInput: h&0x18 == 0x18,
			HasQueuedPrompt:  h&0x1c == 0x04,
			InputReliable:    h&0x07 != 0x07,
		}
		in.Batch.Complete = h&0x03 != 0x03 || n == 0
		for i := 0; i < n && len(data) >= 4; i++ {
			b := data[:4]
			data = data[4:]
			terminal := "error"
			if b[1]%3 == 0 {
				terminal = *pick(fuzzTerminals, b[1]>>2%4)
			}
			o := Observation{
				CallID: string(rune('a' + i)), PolicyToolName: pick(fuzzTools, b[0]%8),
				TerminalStatus: terminal, ExecutionStatus: pick(fuzzExecutions, b[2]%9),
				ExecutionErrorType: pick(fuzzErrorTypes, b[3]%7), ProviderDuplicate: b[3]&0x80 != 0 && b[3]&0x40 != 0,
			}
			if b[2]%9 >= 6 { // mostly eligible failures, so streaks get long
				e := "error"
				o.ExecutionStatus = &e
			}
			in.Batch.Observations = append(in.Batch.Observations, o)
		}
		inputs = append(inputs, in)
	}
	return inputs
}

// checkSequence runs inputs from the initial state and checks the reducer's invariants.
func checkSequence(t *testing.T, inputs []Input, threshold, batchThreshold int) {
	state := Initial()
	warnedOrdinal := 0 // the candidate that was warned (0: none)
	for i, in := range inputs {
		d := ReduceWithThresholds(state, in, threshold, batchThreshold)
		s := d.State
		if s.FailureCount < 0 || s.BatchCount < 0 || s.CandidateOrdinal < 0 || s.NextCandidateOrdinal < 1 {
			t.Fatalf("step %d: negative count in %+v", i, s)
		}
		if s.NextCandidateOrdinal < state.NextCandidateOrdinal {
			t.Fatalf("step %d: next_candidate_ordinal went back", i)
		}
		if state.EnforcementDisabled && !s.EnforcementDisabled {
			t.Fatalf("step %d: enforcement_disabled was cleared", i)
		}
		if state.Phase == PhaseLatched && (d.Kind != KindNone || s != state) {
			t.Fatalf("step %d: latched is not absorbing: %s", i, d.Kind)
		}
		if (d.Kind == KindReset) != (d.Reason != "") {
			t.Fatalf("step %d: reason %q on %s", i, d.Reason, d.Kind)
		}
		if d.Kind == KindNone && !sameState(s, state) {
			t.Fatalf("step %d: none changed the state", i)
		}
		if s.Phase == PhaseIdle && (s.Key != nil || s.FailureCount != 0 || s.BatchCount != 0 || s.CandidateOrdinal != 0) {
			t.Fatalf("step %d: idle with a candidate %+v", i, s)
		}
		if s.Phase != PhaseIdle && (s.Key == nil || s.CandidateOrdinal < 1 || s.CandidateOrdinal >= s.NextCandidateOrdinal) {
			t.Fatalf("step %d: %s without a candidate %+v", i, s.Phase, s)
		}
		switch d.Kind {
		case KindWarn, KindWouldWarn:
			warnedOrdinal = s.CandidateOrdinal
			if s.FailureCount < threshold || s.BatchCount < batchThreshold {
				t.Fatalf("step %d: warned below the thresholds %+v", i, s)
			}
		case KindStop, KindWouldStop:
			if warnedOrdinal != s.CandidateOrdinal || state.Phase != PhaseWarned {
				t.Fatalf("step %d: %s of candidate %d without its warning", i, d.Kind, s.CandidateOrdinal)
			}
			if d.Kind == KindStop && (s.EnforcementDisabled || in.Mode != ModeEnforce) {
				t.Fatalf("step %d: stop while enforcement is not in effect", i)
			}
		case KindReset:
			if s.Phase != PhaseIdle {
				t.Fatalf("step %d: reset to %s", i, s.Phase)
			}
		}
		if d.Kind == KindWarn && in.Mode == ModeShadow {
			t.Fatalf("step %d: warn in shadow", i)
		}
		state = s
	}
}

func sameState(a, b State) bool {
	if (a.Key == nil) != (b.Key == nil) || (a.Key != nil && *a.Key != *b.Key) {
		return false
	}
	a.Key, b.Key = nil, nil
	return a == b
}

func FuzzReducerInvariants(f *testing.F) {
	// Seeds: a warned-then-stopped loop in each mode, recoveries, and mixed noise.
	loop := []byte{}
	for i := 0; i < 5; i++ {
		loop = append(loop, 0x82|0x00, 0, 0, 8, 0, 0, 0, 8, 0, 0, 0, 8, 0, 0, 0, 8, 0)
	}
	f.Add(loop, uint8(8), uint8(2))
	f.Add(loop, uint8(1), uint8(1))
	f.Add(append([]byte{0x22, 0, 0, 8, 0}, loop...), uint8(3), uint8(2))
	f.Add([]byte{0xff, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 0x07, 0x18}, uint8(8), uint8(2))
	f.Add([]byte{0x40, 1, 3, 4, 0, 0x60, 0, 0, 8, 1, 1, 0, 8, 1}, uint8(2), uint8(1))
	f.Fuzz(func(t *testing.T, data []byte, threshold, batchThreshold uint8) {
		if len(data) > 4096 {
			return
		}
		checkSequence(t, decodeInputs(data), int(threshold%20)+1, int(batchThreshold%5)+1)
	})
}

// TestInvariantsOnVectors runs the invariant checks on every scenario of the shared vectors.
func TestInvariantsOnVectors(t *testing.T) {
	v := loadVectors(t)
	for _, sc := range v.Scenarios {
		if sc.Initial.Phase != PhaseIdle || sc.Initial.EnforcementDisabled {
			continue
		}
		var inputs []Input
		for _, step := range sc.Steps {
			inputs = append(inputs, step.Input.input())
		}
		checkSequence(t, inputs, sc.Threshold, sc.BatchThreshold)
	}
}
