// Package reducer is the pure repeated-tool-failure reducer of docs/contract.md section 2, the
// same function as the Python package's otel_guard.reducer: from (state, input) to a decision,
// with immutable values and no side effects. Shared test vectors (tests/vectors/reducer.json)
// hold both implementations to one truth.
package reducer // import "github.com/otel-guard/otel-guard/collector/repeatedtoolfailureguardconnector/internal/reducer"

import "strings"

// The live constants: eligible failures of one key needed before the guard warns, across at
// least this many complete batches.
const (
	Threshold      = 8
	BatchThreshold = 2
)

// Reminder and StopMessage are the host texts of docs/contract.md section 2.
const (
	Reminder    = "System: the same tool execution has failed repeatedly for the same classified reason. Do not repeat the same approach. Inspect the returned result, change the approach or required preconditions, or explain the blocker."
	StopMessage = "Automatic continuation stopped because the same tool execution failure continued after a corrective reminder. New user input is required to continue."
)

// Modes.
const (
	ModeOff     = "off"
	ModeShadow  = "shadow"
	ModeWarn    = "warn"
	ModeEnforce = "enforce"
)

// Phases.
const (
	PhaseIdle     = "idle"
	PhaseTracking = "tracking"
	PhaseWarned   = "warned"
	PhaseLatched  = "latched"
)

// Decision kinds.
const (
	KindNone      = "none"
	KindReset     = "reset"
	KindTracked   = "tracked"
	KindWouldWarn = "would_warn"
	KindWarn      = "warn"
	KindWouldStop = "would_stop"
	KindStop      = "stop"
)

// Reset reasons.
const (
	ReasonSuccess              = "success"
	ReasonCancelled            = "cancelled"
	ReasonNotStarted           = "not_started"
	ReasonPostExecutionFailure = "post_execution_failure"
	ReasonUnknown              = "unknown"
	ReasonMixed                = "mixed"
	ReasonIncomplete           = "incomplete"
	ReasonExternalInput        = "external_input"
	ReasonQueuedPrompt         = "queued_prompt"
	ReasonUnreliableInput      = "unreliable_input"
	ReasonContractViolation    = "contract_violation"
)

// ResetReasons lists every reset reason, in the order of the contract.
var ResetReasons = []string{
	ReasonSuccess, ReasonCancelled, ReasonNotStarted, ReasonPostExecutionFailure, ReasonUnknown,
	ReasonMixed, ReasonIncomplete, ReasonExternalInput, ReasonQueuedPrompt, ReasonUnreliableInput,
	ReasonContractViolation,
}

// The precedence of the reasons one batch can collect while classifying (step 6).
var reasonPrecedence = [...]string{
	ReasonContractViolation, ReasonCancelled, ReasonUnknown, ReasonNotStarted, ReasonPostExecutionFailure,
}

// FailureKey is the private identity of a candidate streak. It never leaves the process.
type FailureKey struct {
	PolicyToolName     string
	ExecutionErrorType string
}

// Observation is one settled tool call of a batch. A nil pointer is a missing value.
type Observation struct {
	CallID             string
	PolicyToolName     *string
	ToolType           *string
	TerminalStatus     string
	ExecutionStatus    *string
	ExecutionErrorType *string
	ProviderDuplicate  bool
}

// Batch is a model tool batch; Complete only when every admitted call settled.
type Batch struct {
	Complete     bool
	Observations []Observation
}

// Input is one settled batch plus the result of the mid-turn input drain that followed it.
type Input struct {
	Mode             string
	Batch            Batch
	HasExternalInput bool
	HasQueuedPrompt  bool
	InputReliable    bool
}

// State is the per-prompt guard state. Key is nil when no candidate is tracked.
type State struct {
	Phase                string
	Key                  *FailureKey
	FailureCount         int
	BatchCount           int
	CandidateOrdinal     int
	NextCandidateOrdinal int
	EnforcementDisabled  bool
}

// Initial is the state of a fresh prompt.
func Initial() State {
	return State{Phase: PhaseIdle, NextCandidateOrdinal: 1}
}

// Decision is what one batch did to the state; Reason is set only for a reset.
type Decision struct {
	Kind   string
	State  State
	Reason string
}

var modes = map[string]string{ModeOff: ModeOff, ModeShadow: ModeShadow, ModeWarn: ModeWarn, ModeEnforce: ModeEnforce}

// ParseMode trims and lower-cases value and returns the mode it names, or "" and false.
func ParseMode(value string) (string, bool) {
	if m, ok := modes[value]; ok {
		return m, true
	}
	m, ok := modes[strings.ToLower(strings.TrimSpace(value))]
	return m, ok
}

// EffectiveMode downgrades enforce to warn once enforcement is disabled for the prompt.
func EffectiveMode(mode string, enforcementDisabled bool) string {
	if mode == ModeEnforce && enforcementDisabled {
		return ModeWarn
	}
	return mode
}

func reset(state State, reason string, disable bool) Decision {
	disabled := state.EnforcementDisabled || disable
	if state.Phase == PhaseIdle && disabled == state.EnforcementDisabled {
		return Decision{Kind: KindNone, State: state}
	}
	return Decision{
		Kind:   KindReset,
		State:  State{Phase: PhaseIdle, NextCandidateOrdinal: state.NextCandidateOrdinal, EnforcementDisabled: disabled},
		Reason: reason,
	}
}

// eligibleErrorType reports whether value is a classified error type: not "unknown" and
// matching ^[a-z][a-z0-9_.-]{0,63}$.
func eligibleErrorType(value string) bool {
	if value == "unknown" || len(value) == 0 || len(value) > 64 {
		return false
	}
	if c := value[0]; c < 'a' || c > 'z' {
		return false
	}
	for i := 1; i < len(value); i++ {
		c := value[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-') {
			return false
		}
	}
	return true
}

// blank is Python's `not s.strip()`: empty or only whitespace.
func blank(s string) bool {
	return strings.TrimSpace(s) == ""
}

// Reduce applies one settled batch to state (docs/contract.md section 2). An input mode that is
// not one of the four modes is treated as shadow, as the Python reducer does.
func Reduce(state State, input Input) Decision {
	return ReduceWithThresholds(state, input, Threshold, BatchThreshold)
}

// ReduceWithThresholds is Reduce as if Threshold and BatchThreshold were threshold and
// batchThreshold: for what-if analysis only, never the live guard.
func ReduceWithThresholds(state State, input Input, threshold, batchThreshold int) Decision {
	mode, ok := ParseMode(input.Mode)
	if !ok {
		mode = ModeShadow
	}
	// 1. Off, or latched until the prompt ends.
	if mode == ModeOff || state.Phase == PhaseLatched {
		return Decision{Kind: KindNone, State: state}
	}
	// 2-3. Input boundary and completeness.
	if !input.InputReliable {
		return reset(state, ReasonUnreliableInput, true)
	}
	if input.HasExternalInput {
		return reset(state, ReasonExternalInput, false)
	}
	if input.HasQueuedPrompt {
		return reset(state, ReasonQueuedPrompt, false)
	}
	if !input.Batch.Complete {
		return reset(state, ReasonIncomplete, false)
	}

	// 4-5. Classify. Provider duplicates neither advance nor reset.
	counted := false
	reasons := map[string]bool{}
	disable := false
	succeeded := map[string]bool{}
	var failures []FailureKey
	unknown := func() {
		reasons[ReasonUnknown] = true
		disable = true
	}
	for _, o := range input.Batch.Observations {
		if o.ProviderDuplicate {
			continue
		}
		counted = true
		exec := ""
		if o.ExecutionStatus != nil {
			exec = *o.ExecutionStatus
		}
		switch {
		case o.TerminalStatus == "cancelled":
			reasons[ReasonCancelled] = true
		case o.ExecutionStatus == nil || exec == "unknown":
			unknown()
		case o.TerminalStatus == "success":
			switch exec {
			case "error", "cancelled":
				reasons[ReasonContractViolation] = true
				disable = true
			case "success", "not_started":
				if o.PolicyToolName == nil || blank(*o.PolicyToolName) {
					unknown()
				} else {
					succeeded[*o.PolicyToolName] = true
				}
			default:
				unknown()
			}
		case o.TerminalStatus != "error":
			unknown()
		case exec == "error":
			if o.PolicyToolName == nil || blank(*o.PolicyToolName) || o.ExecutionErrorType == nil || !eligibleErrorType(*o.ExecutionErrorType) {
				unknown()
			} else {
				failures = append(failures, FailureKey{*o.PolicyToolName, *o.ExecutionErrorType})
			}
		case exec == "cancelled":
			reasons[ReasonCancelled] = true
		case exec == "not_started":
			reasons[ReasonNotStarted] = true
		case exec == "success":
			reasons[ReasonPostExecutionFailure] = true
		default:
			unknown()
		}
	}
	if !counted {
		return Decision{Kind: KindNone, State: state}
	}

	// 6. Any ineligible outcome resets, by precedence.
	if len(reasons) > 0 {
		for _, r := range reasonPrecedence {
			if reasons[r] {
				return reset(state, r, disable)
			}
		}
	}

	// 7. A tool's success clears that tool's failures in the same batch.
	remaining := failures
	if len(succeeded) > 0 {
		remaining = nil
		for _, k := range failures {
			if !succeeded[k.PolicyToolName] {
				remaining = append(remaining, k)
			}
		}
	}
	if len(remaining) == 0 {
		if state.Key != nil && succeeded[state.Key.PolicyToolName] {
			return reset(state, ReasonSuccess, false)
		}
		if len(succeeded) > 0 {
			return Decision{Kind: KindNone, State: state}
		}
		return reset(state, ReasonUnknown, true)
	}

	// 8. One candidate at a time.
	key := remaining[0]
	for _, k := range remaining[1:] {
		if k != key {
			return reset(state, ReasonMixed, false)
		}
	}

	// 9. A new key starts a new streak with a new ordinal.
	if state.Key == nil || *state.Key != key {
		k := key
		return Decision{Kind: KindTracked, State: State{
			Phase: PhaseTracking, Key: &k, FailureCount: len(remaining), BatchCount: 1,
			CandidateOrdinal: state.NextCandidateOrdinal, NextCandidateOrdinal: state.NextCandidateOrdinal + 1,
			EnforcementDisabled: state.EnforcementDisabled,
		}}
	}

	// 10. The same key continues the streak.
	next := state
	k := key
	next.Key = &k
	next.FailureCount += len(remaining)
	next.BatchCount++
	var kind string
	switch {
	case state.Phase == PhaseWarned:
		if EffectiveMode(mode, state.EnforcementDisabled) == ModeEnforce {
			kind = KindStop
		} else {
			kind = KindWouldStop
		}
		next.Phase = PhaseLatched
	case next.FailureCount >= threshold && next.BatchCount >= batchThreshold:
		if mode == ModeShadow {
			kind = KindWouldWarn
		} else {
			kind = KindWarn
		}
		next.Phase = PhaseWarned
	default:
		kind = KindTracked
		next.Phase = PhaseTracking
	}
	return Decision{Kind: kind, State: next}
}
