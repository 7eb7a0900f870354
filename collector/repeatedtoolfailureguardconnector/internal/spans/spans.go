// Package spans reads the spans the guard cares about (docs/contract.md sections 3, 3b and 3c)
// from OTLP spans that have ended: it keeps only the few fields the guard needs, so a buffered
// span costs little, and classifies each span from the attributes it ended with.
package spans // import "github.com/otel-guard/otel-guard/collector/repeatedtoolfailureguardconnector/internal/spans"

import (
	"crypto/sha256"
	"encoding/hex"
	"math"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/otel-guard/otel-guard/collector/repeatedtoolfailureguardconnector/internal/telemetry"
)

// Attribute names (docs/contract.md section 3 and the profiles of 3b and 3c).
const (
	OperationName         = "gen_ai.operation.name"
	InvokeAgent           = "invoke_agent"
	ExecuteTool           = "execute_tool"
	ToolName              = "gen_ai.tool.name"
	ToolCallID            = "gen_ai.tool.call.id"
	ConversationID        = "gen_ai.conversation.id"
	ErrorType             = "error.type"
	ExceptionEvent        = "exception"
	ExceptionType         = "exception.type"
	PromptID              = "acp.prompt.id"
	PromptRoute           = "acp.prompt.route"
	PromptChannel         = "acp.prompt.channel"
	RouteInteractive      = "interactive"
	BatchAdmitted         = "acp.batch.admitted"
	InputExternal         = "acp.input.external"
	InputQueuedPrompt     = "acp.input.queued_prompt"
	InputReliable         = "acp.input.reliable"
	ToolType              = "acp.tool.type"
	ToolStatus            = "acp.tool.status"
	ToolExecutionStatus   = "acp.tool.execution.status"
	ToolExecutionError    = "acp.tool.execution.error_type"
	ToolProviderDuplicate = "acp.tool.provider_duplicate"
	OISpanKind            = "openinference.span.kind"
	OIToolName            = "tool.name"
	OIToolCallID          = "tool_call.id"
	OIToolID              = "tool.id"
	OISessionID           = "session.id"
	ACPPrefix             = "acp."
	MCPPrefix             = "mcp."
	// MergedTools is Google ADK's tool name on its `execute_tool (merged)` span: not a call.
	MergedTools = "(merged tools)"
)

// Longer values are treated as missing, as the Python guard does.
const (
	MaxIDLength       = 256
	MaxToolNameLength = 256
	MaxStatusLength   = 64
)

// Bool is an attribute that may be a boolean: Set only when the value is a boolean.
type Bool struct {
	Set, Value bool
}

// Str is an attribute that may be a string: Set only when the value is a string.
type Str struct {
	Set   bool
	Value string
}

// Ptr is the string as a pointer: nil when not set.
func (s Str) Ptr() *string {
	if !s.Set {
		return nil
	}
	v := s.Value
	return &v
}

// Int is an integer attribute: Present when the key is there at all, Set when it is an int.
type Int struct {
	Present, Set bool
	Value        int64
}

// Span is what the guard keeps of one ended span.
type Span struct {
	TraceID  pcommon.TraceID
	SpanID   pcommon.SpanID
	ParentID pcommon.SpanID
	Start    uint64
	End      uint64
	Resource telemetry.Resource

	StatusError bool
	// RemoteParent: the parent span is in another process (the OTLP span flags say so).
	RemoteParent bool
	hasOpKey     bool

	Operation     Str
	HasPromptID   bool
	PromptID      Str
	Admitted      Int
	Route         Str
	Channel       Bool
	External      Bool
	Queued        Bool
	Reliable      Bool
	ToolName      Str
	CallID        Str
	ToolType      Str
	Status        Str
	Execution     Str
	ExecErrorType Str
	ProviderDup   Bool
	HasACP        bool
	HasMCP        bool
	HasCallIDKey  bool
	HasToolName   bool
	ErrorType     Str
	ErrorTypeSet  bool // error.type present with any value
	ExceptionType Str  // of the last exception event
	Conversation  Str
	OIKind        Str
	OIToolName    Str
	OIToolCallID  Str
	OIToolID      Str
	SessionID     Str

	// Size is the span's estimated cost in bytes while buffered.
	Size int
}

func str(v pcommon.Value) Str {
	if v.Type() == pcommon.ValueTypeStr {
		return Str{Set: true, Value: v.Str()}
	}
	return Str{}
}

func boolean(v pcommon.Value) Bool {
	if v.Type() == pcommon.ValueTypeBool {
		return Bool{Set: true, Value: v.Bool()}
	}
	return Bool{}
}

// baseSize is what a kept span is counted as, besides its strings.
const baseSize = 320

// DeprecatedDeploymentEnvironment is the deployment environment's key before
// deployment.environment.name; many agents still set it.
const DeprecatedDeploymentEnvironment = "deployment.environment"

// ResourceOf reads the resource attributes the guard's output carries, as the Python replay
// groups its report (otel_guard.replay.replayer.group_of): the deployment environment from
// deployment.environment.name, else the deprecated deployment.environment, and a value that is
// not a string written as Python's str() writes it.
func ResourceOf(res pcommon.Resource) telemetry.Resource {
	var r telemetry.Resource
	attrs := res.Attributes()
	if v, ok := attrs.Get(telemetry.ServiceVersion); ok {
		r.ServiceVersion = pyStr(v)
	}
	v, ok := attrs.Get(telemetry.DeploymentEnvironment)
	if !ok {
		v, ok = attrs.Get(DeprecatedDeploymentEnvironment)
	}
	if ok {
		r.DeploymentEnvironment = pyStr(v)
	}
	return r
}

// pyStr is an attribute value as Python's str() writes the SDK's value of it.
func pyStr(v pcommon.Value) string {
	switch v.Type() {
	case pcommon.ValueTypeStr:
		return v.Str()
	case pcommon.ValueTypeBool:
		if v.Bool() {
			return "True"
		}
		return "False"
	case pcommon.ValueTypeDouble:
		f := v.Double()
		if f == math.Trunc(f) && math.Abs(f) < 1e16 {
			return strconv.FormatFloat(f, 'f', 1, 64)
		}
	}
	return v.AsString()
}

// Read keeps what the guard needs of an OTLP span.
func Read(s ptrace.Span, resource telemetry.Resource) *Span {
	out := &Span{
		TraceID:     s.TraceID(),
		SpanID:      s.SpanID(),
		ParentID:    s.ParentSpanID(),
		Start:       uint64(s.StartTimestamp()),
		End:         uint64(s.EndTimestamp()),
		Resource:    resource,
		StatusError: s.Status().Code() == ptrace.StatusCodeError,
		// OTLP span flags: bit 8 says whether bit 9 (the parent is remote) is known.
		RemoteParent: s.Flags()&0x300 == 0x300,
	}
	size := baseSize
	s.Attributes().Range(func(k string, v pcommon.Value) bool {
		if strings.HasPrefix(k, ACPPrefix) {
			out.HasACP = true
		}
		if strings.HasPrefix(k, MCPPrefix) {
			out.HasMCP = true
		}
		keep := true
		switch k {
		case OperationName:
			out.hasOpKey = true
			out.Operation = str(v)
		case PromptID:
			out.HasPromptID = true
			out.PromptID = str(v)
		case BatchAdmitted:
			out.Admitted.Present = true
			if v.Type() == pcommon.ValueTypeInt {
				out.Admitted.Set = true
				out.Admitted.Value = v.Int()
			}
		case PromptRoute:
			out.Route = str(v)
		case PromptChannel:
			out.Channel = boolean(v)
		case InputExternal:
			out.External = boolean(v)
		case InputQueuedPrompt:
			out.Queued = boolean(v)
		case InputReliable:
			out.Reliable = boolean(v)
		case ToolName:
			out.HasToolName = true
			out.ToolName = str(v)
		case ToolCallID:
			out.HasCallIDKey = true
			out.CallID = str(v)
		case ToolType:
			out.ToolType = str(v)
		case ToolStatus:
			out.Status = str(v)
		case ToolExecutionStatus:
			out.Execution = str(v)
		case ToolExecutionError:
			out.ExecErrorType = str(v)
		case ToolProviderDuplicate:
			out.ProviderDup = boolean(v)
		case ErrorType:
			out.ErrorTypeSet = true
			out.ErrorType = str(v)
		case ConversationID:
			out.Conversation = str(v)
		case OISpanKind:
			out.OIKind = str(v)
		case OIToolName:
			out.OIToolName = str(v)
		case OIToolCallID:
			out.OIToolCallID = str(v)
		case OIToolID:
			out.OIToolID = str(v)
		case OISessionID:
			out.SessionID = str(v)
		default:
			keep = false
		}
		if keep && v.Type() == pcommon.ValueTypeStr {
			size += len(v.Str())
		}
		return true
	})
	events := s.Events()
	for i := events.Len() - 1; i >= 0; i-- {
		e := events.At(i)
		if e.Name() == ExceptionEvent {
			if v, ok := e.Attributes().Get(ExceptionType); ok {
				out.ExceptionType = str(v)
				size += len(out.ExceptionType.Value)
			}
			break
		}
	}
	out.Size = size
	return out
}

// Kind is what a span is to the guard.
type Kind int

// Kinds of spans.
const (
	Other Kind = iota
	ACPPrompt
	ACPBatch // a span with a prompt ID that is neither a prompt nor a tool call
	ACPTool  // an execute_tool span; section 3 when its parent is a batch span
	GenAIPrompt
	ModelCall
	GenAITool
	OIPrompt
)

// Profile names how a prompt is read.
type Profile int

// Profiles.
const (
	ProfileNone Profile = iota
	ProfileACP
	ProfileGenAI
	ProfileOpenInference
)

var modelOperations = map[string]bool{"chat": true, "text_completion": true, "generate_content": true}

// IsModelOperation reports whether op is a model call's operation name.
func IsModelOperation(op string) bool { return modelOperations[op] }

// Classify says what an ended span is, from its own attributes (its place in the trace, the
// parent chain, is the assembly's to judge). root says whether the span has no parent in this
// process (OpenInference: a root CHAIN is a prompt).
func Classify(s *Span, root bool) Kind {
	op := s.Operation
	if s.HasPromptID {
		if op.Set && op.Value == ExecuteTool {
			return ACPTool
		}
		if !s.PromptID.Set {
			return Other
		}
		if op.Set && op.Value == InvokeAgent && !s.Admitted.Present {
			return ACPPrompt
		}
		return ACPBatch
	}
	if op.Set && op.Value == ExecuteTool {
		if s.HasACP {
			return ACPTool
		}
		if s.ToolName.Set && s.ToolName.Value == MergedTools {
			return Other
		}
		return GenAITool
	}
	if s.Operation.Set || (s.HasToolName && s.HasCallIDKey) {
		switch {
		case op.Set && op.Value == InvokeAgent:
			return GenAIPrompt
		case op.Set && modelOperations[op.Value]:
			return ModelCall
		case s.HasToolName && s.HasCallIDKey && !s.HasACP:
			if s.ToolName.Set && s.ToolName.Value == MergedTools {
				return Other
			}
			return GenAITool
		}
		return Other
	}
	if s.OIKind.Set && !s.HasACP && !s.HasOperationKey() {
		switch strings.ToUpper(s.OIKind.Value) {
		case "AGENT":
			return OIPrompt
		case "CHAIN":
			if root {
				return OIPrompt
			}
		case "LLM":
			return ModelCall
		case "TOOL":
			return GenAITool
		}
	}
	return Other
}

// HasOperationKey reports whether gen_ai.operation.name was present (with any value).
func (s *Span) HasOperationKey() bool { return s.hasOpKey }

// Hex16 is a span ID as 16 lower-case hex digits.
func Hex16(id pcommon.SpanID) string {
	const digits = "0123456789abcdef"
	b := make([]byte, 16)
	for i, c := range id {
		b[2*i] = digits[c>>4]
		b[2*i+1] = digits[c&15]
	}
	return string(b)
}

// UsableID reports whether a call ID can key a call: at most MaxIDLength characters, and no
// placeholder (empty or "<not specified>", around whitespace), which counts as missing (section
// 3b, [12-02]) in every profile, as the Python guard reads it.
func UsableID(s Str) bool {
	if !s.Set || !Fits(s.Value, MaxIDLength) {
		return false
	}
	v := strings.TrimFunc(s.Value, pythonSpace)
	return v != "" && v != "<not specified>"
}

// Fits reports whether v has at most n characters, counted as Python counts a str (code
// points), not in bytes: a limit means the same in both guards for any script.
func Fits(v string, n int) bool {
	return len(v) <= n || utf8.RuneCountInString(v) <= n
}

// pythonSpace is what Python's str.strip() removes: Unicode white space and the four
// information separators U+001C to U+001F.
func pythonSpace(r rune) bool {
	return unicode.IsSpace(r) || (r >= 0x1c && r <= 0x1f)
}

// MaxPromptIDLength is the longest prompt ID kept as it is; a longer one is kept as its digest.
const MaxPromptIDLength = 256

// BoundedID is the key under which a prompt's state is kept: the ID itself, or for an ID of
// more than 256 characters "sha256:" and the hex digest of its UTF-8 bytes, so memory does not
// grow with ID length and equal IDs still meet (as the Python guard keeps them).
func BoundedID(id string) string {
	if len(id) <= MaxPromptIDLength || utf8.RuneCountInString(id) <= MaxPromptIDLength {
		return id
	}
	sum := sha256.Sum256([]byte(id))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// GenAIPromptID is the prompt ID of a GenAI (3b) or OpenInference (3c) prompt span.
func GenAIPromptID(s *Span, oi bool) string {
	id := s.Conversation
	if oi {
		id = s.SessionID
	}
	if id.Set && id.Value != "" {
		return BoundedID(id.Value)
	}
	return Hex16(s.SpanID)
}

// InferredCall is the observation of a GenAI or OpenInference tool span: call ID, tool name,
// tool type, and outcome (docs/contract.md sections 3b and 3c).
func InferredCall(s *Span) (callID string, toolName *string, toolType string, failed bool, errorType *string) {
	oi := !s.hasOpKey && s.OIKind.Set
	switch {
	case oi && UsableID(s.OIToolCallID):
		callID = s.OIToolCallID.Value
	case oi && UsableID(s.OIToolID):
		callID = s.OIToolID.Value
	case !oi && UsableID(s.CallID):
		callID = s.CallID.Value
	default:
		callID = Hex16(s.SpanID)
	}
	name := s.ToolName
	if oi {
		name = s.OIToolName
	}
	if name.Set && Fits(name.Value, MaxToolNameLength) {
		toolName = name.Ptr()
	}
	toolType = "native"
	if s.HasMCP {
		toolType = "mcp"
	}
	failed = s.ErrorTypeSet || s.StatusError
	if !failed {
		return
	}
	if s.ErrorType.Set && s.ErrorType.Value != "" {
		v := strings.ToLower(s.ErrorType.Value)
		errorType = &v
	} else if s.ExceptionType.Set && s.ExceptionType.Value != "" {
		v := strings.ToLower(s.ExceptionType.Value)
		errorType = &v
	}
	return
}

// OptedOut reports whether a prompt or batch span marks its prompt as not guarded: a route
// other than the interactive one, or a channel prompt.
func OptedOut(s *Span) bool {
	return (s.Route.Set && s.Route.Value != RouteInteractive) || (s.Channel.Set && s.Channel.Value)
}
