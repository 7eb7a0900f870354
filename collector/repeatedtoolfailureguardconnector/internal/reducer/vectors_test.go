package reducer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// The shared vectors, generated from the Python reducer (tests/vectors/reducer.json).
var vectorsPath = filepath.Join("..", "..", "..", "..", "tests", "vectors", "reducer.json")

type jsonState struct {
	Phase                string   `json:"phase"`
	Key                  []string `json:"key"`
	FailureCount         int      `json:"failure_count"`
	BatchCount           int      `json:"batch_count"`
	CandidateOrdinal     int      `json:"candidate_ordinal"`
	NextCandidateOrdinal int      `json:"next_candidate_ordinal"`
	EnforcementDisabled  bool     `json:"enforcement_disabled"`
}

func (s jsonState) state() State {
	st := State{
		Phase: s.Phase, FailureCount: s.FailureCount, BatchCount: s.BatchCount,
		CandidateOrdinal: s.CandidateOrdinal, NextCandidateOrdinal: s.NextCandidateOrdinal,
		EnforcementDisabled: s.EnforcementDisabled,
	}
	if s.Key != nil {
		st.Key = &FailureKey{s.Key[0], s.Key[1]}
	}
	return st
}

type jsonObservation struct {
	CallID             string  `json:"call_id"`
	PolicyToolName     *string `json:"policy_tool_name"`
	ToolType           *string `json:"tool_type"`
	TerminalStatus     string  `json:"terminal_status"`
	ExecutionStatus    *string `json:"execution_status"`
	ExecutionErrorType *string `json:"execution_error_type"`
	ProviderDuplicate  bool    `json:"provider_duplicate"`
}

type jsonInput struct {
	Mode             string            `json:"mode"`
	Complete         bool              `json:"complete"`
	Observations     []jsonObservation `json:"observations"`
	HasExternalInput bool              `json:"has_external_input"`
	HasQueuedPrompt  bool              `json:"has_queued_prompt"`
	InputReliable    bool              `json:"input_reliable"`
}

func (in jsonInput) input() Input {
	obs := make([]Observation, len(in.Observations))
	for i, o := range in.Observations {
		obs[i] = Observation(o)
	}
	return Input{
		Mode: in.Mode, Batch: Batch{Complete: in.Complete, Observations: obs},
		HasExternalInput: in.HasExternalInput, HasQueuedPrompt: in.HasQueuedPrompt, InputReliable: in.InputReliable,
	}
}

type vectors struct {
	Scenarios []struct {
		Name           string    `json:"name"`
		Threshold      int       `json:"threshold"`
		BatchThreshold int       `json:"batch_threshold"`
		Initial        jsonState `json:"initial"`
		Steps          []struct {
			Input  jsonInput `json:"input"`
			Kind   string    `json:"kind"`
			Reason *string   `json:"reason"`
			State  jsonState `json:"state"`
		} `json:"steps"`
	} `json:"scenarios"`
}

func loadVectors(t testing.TB) vectors {
	t.Helper()
	raw, err := os.ReadFile(vectorsPath)
	if err != nil {
		t.Fatalf("reading the shared vectors: %v", err)
	}
	var v vectors
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatalf("decoding the shared vectors: %v", err)
	}
	if len(v.Scenarios) < 100 {
		t.Fatalf("only %d scenarios in the shared vectors", len(v.Scenarios))
	}
	return v
}

func TestSharedVectors(t *testing.T) {
	v := loadVectors(t)
	steps := 0
	for _, sc := range v.Scenarios {
		state := sc.Initial.state()
		for i, step := range sc.Steps {
			steps++
			got := ReduceWithThresholds(state, step.Input.input(), sc.Threshold, sc.BatchThreshold)
			reason := ""
			if step.Reason != nil {
				reason = *step.Reason
			}
			want := step.State.state()
			if got.Kind != step.Kind || got.Reason != reason || !reflect.DeepEqual(got.State, want) {
				t.Fatalf("%s step %d: got %s/%q %+v (key %v), want %s/%q %+v (key %v)",
					sc.Name, i, got.Kind, got.Reason, got.State, got.State.Key, step.Kind, reason, want, want.Key)
			}
			if sc.Threshold == Threshold && sc.BatchThreshold == BatchThreshold {
				if live := Reduce(state, step.Input.input()); !reflect.DeepEqual(live, got) {
					t.Fatalf("%s step %d: Reduce differs from ReduceWithThresholds at the live constants", sc.Name, i)
				}
			}
			state = got.State
		}
	}
	if steps < 1000 {
		t.Fatalf("only %d steps checked", steps)
	}
}

func TestParseMode(t *testing.T) {
	for in, want := range map[string]string{"shadow": "shadow", " ENFORCE\t": "enforce", "Warn": "warn", "off": "off", "": "", "enforced": ""} {
		got, ok := ParseMode(in)
		if got != want || ok != (want != "") {
			t.Errorf("ParseMode(%q) = %q, %v; want %q", in, got, ok, want)
		}
	}
}
