package spans

import (
	"strings"
	"testing"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/otel-guard/otel-guard/collector/repeatedtoolfailureguardconnector/internal/telemetry"
)

func read(attrs map[string]any, mutate ...func(ptrace.Span)) *Span {
	s := ptrace.NewSpan()
	if err := s.Attributes().FromRaw(attrs); err != nil {
		panic(err)
	}
	for _, m := range mutate {
		m(s)
	}
	return Read(s, telemetry.Resource{})
}

func TestClassify(t *testing.T) {
	cases := []struct {
		name  string
		attrs map[string]any
		root  bool
		want  Kind
	}{
		{"acp prompt", map[string]any{OperationName: InvokeAgent, PromptID: "p"}, true, ACPPrompt},
		{"acp batch", map[string]any{PromptID: "p", BatchAdmitted: int64(2)}, false, ACPBatch},
		{"invoke_agent with admitted is a batch", map[string]any{OperationName: InvokeAgent, PromptID: "p", BatchAdmitted: int64(2)}, false, ACPBatch},
		{"prompt ID not a string", map[string]any{PromptID: int64(3)}, false, Other},
		{"acp tool", map[string]any{OperationName: ExecuteTool, ToolType: "native"}, false, ACPTool},
		{"genai tool", map[string]any{OperationName: ExecuteTool, ToolName: "t"}, false, GenAITool},
		{"tool by attributes", map[string]any{ToolName: "t", ToolCallID: "c"}, false, GenAITool},
		{"merged tools", map[string]any{OperationName: ExecuteTool, ToolName: MergedTools}, false, Other},
		{"genai prompt", map[string]any{OperationName: InvokeAgent}, true, GenAIPrompt},
		{"model call", map[string]any{OperationName: "generate_content"}, false, ModelCall},
		{"other operation", map[string]any{OperationName: "embeddings"}, false, Other},
		{"oi agent", map[string]any{OISpanKind: "AGENT"}, false, OIPrompt},
		{"oi root chain", map[string]any{OISpanKind: "CHAIN"}, true, OIPrompt},
		{"oi inner chain", map[string]any{OISpanKind: "CHAIN"}, false, Other},
		{"oi llm", map[string]any{OISpanKind: "LLM"}, false, ModelCall},
		{"oi lower case", map[string]any{OISpanKind: "agent"}, false, OIPrompt},
		{"oi with a non-string operation", map[string]any{OISpanKind: "AGENT", OperationName: int64(1)}, false, Other},
		{"oi tool", map[string]any{OISpanKind: "TOOL"}, false, GenAITool},
		{"oi with acp", map[string]any{OISpanKind: "TOOL", "acp.tool.type": "native"}, false, Other},
		{"oi with genai operation", map[string]any{OISpanKind: "AGENT", OperationName: "chat"}, false, ModelCall},
		{"plain", map[string]any{"http.method": "GET"}, true, Other},
	}
	for _, c := range cases {
		if got := Classify(read(c.attrs), c.root); got != c.want {
			t.Errorf("%s: got %d, want %d", c.name, got, c.want)
		}
	}
}

func TestInferredCall(t *testing.T) {
	exception := func(typ string) func(ptrace.Span) {
		return func(s ptrace.Span) {
			s.Status().SetCode(ptrace.StatusCodeError)
			e := s.Events().AppendEmpty()
			e.SetName("exception")
			e.Attributes().PutStr(ExceptionType, "First")
			e = s.Events().AppendEmpty()
			e.SetName("exception")
			e.Attributes().PutStr(ExceptionType, typ)
		}
	}
	id, name, toolType, failed, errType := InferredCall(read(map[string]any{ToolName: "t", ToolCallID: "c1", ErrorType: "ValueError", "mcp.server": "x"}))
	if id != "c1" || *name != "t" || toolType != "mcp" || !failed || *errType != "valueerror" {
		t.Fatalf("genai: %q %v %q %v %v", id, name, toolType, failed, errType)
	}
	_, _, toolType, failed, errType = InferredCall(read(map[string]any{OISpanKind: "TOOL", OIToolName: "s", OIToolID: "tid"}, exception("KeyError")))
	if toolType != "native" || !failed || *errType != "keyerror" {
		t.Fatalf("oi: %v %v", failed, errType)
	}
	id, _, _, failed, _ = InferredCall(read(map[string]any{OISpanKind: "TOOL", OIToolCallID: "", OIToolID: "tid"}))
	if id != "tid" || failed {
		t.Fatalf("oi id %q", id)
	}
	_, _, _, failed, errType = InferredCall(read(map[string]any{ToolName: "t"}, func(s ptrace.Span) { s.Status().SetCode(ptrace.StatusCodeError) }))
	if !failed || errType != nil {
		t.Fatalf("untyped error: %v %v", failed, errType)
	}
}

func TestOptedOutAndPromptID(t *testing.T) {
	if OptedOut(read(map[string]any{PromptRoute: "interactive"})) || !OptedOut(read(map[string]any{PromptRoute: "cron"})) ||
		!OptedOut(read(map[string]any{PromptChannel: true})) || OptedOut(read(map[string]any{PromptChannel: "true"})) {
		t.Fatal("OptedOut")
	}
	s := read(map[string]any{ConversationID: "conv", OISessionID: "sess"})
	if GenAIPromptID(s, false) != "conv" || GenAIPromptID(s, true) != "sess" {
		t.Fatal("GenAIPromptID")
	}
	if GenAIPromptID(read(map[string]any{}), false) != "0000000000000000" {
		t.Fatal("span ID as 16 hex digits")
	}
}

// The output resource carries the environment and version the Python replay groups by: the
// deprecated deployment.environment when deployment.environment.name is absent, and values
// that are not strings as Python writes them.
func TestResourceOf(t *testing.T) {
	cases := []struct {
		attrs map[string]any
		want  telemetry.Resource
	}{
		{map[string]any{"deployment.environment.name": "prod", "deployment.environment": "old", "service.version": "1.2"}, telemetry.Resource{ServiceVersion: "1.2", DeploymentEnvironment: "prod"}},
		{map[string]any{"deployment.environment": "staging", "service.version": int64(3)}, telemetry.Resource{ServiceVersion: "3", DeploymentEnvironment: "staging"}},
		{map[string]any{"deployment.environment.name": true, "service.version": 2.0}, telemetry.Resource{ServiceVersion: "2.0", DeploymentEnvironment: "True"}},
		{map[string]any{"service.version": 2.5}, telemetry.Resource{ServiceVersion: "2.5"}},
		{map[string]any{"host.name": "h"}, telemetry.Resource{}},
	}
	for _, c := range cases {
		res := pcommon.NewResource()
		if err := res.Attributes().FromRaw(c.attrs); err != nil {
			t.Fatal(err)
		}
		if got := ResourceOf(res); got != c.want {
			t.Errorf("%v: got %+v, want %+v", c.attrs, got, c.want)
		}
	}
}

// Call IDs and lengths are read as the Python guard reads them: a placeholder, padded with any
// white space Python's str.strip() removes, is a missing ID; limits count characters, not bytes.
func TestUsableIDAndFitsCountAsPython(t *testing.T) {
	for _, tc := range []struct {
		value string
		set   bool
		want  bool
	}{
		{"call-1", true, true},
		{"", true, false},
		{"<not specified>", true, false},
		{" <not specified>\t", true, false},
		{"\u00a0<not specified>\u3000", true, false},
		{"\x1c\x1f", true, false},
		{"  ", true, false},
		{strings.Repeat("\u00e9", MaxIDLength), true, true},
		{strings.Repeat("\u00e9", MaxIDLength+1), true, false},
		{"call-1", false, false},
	} {
		if got := UsableID(Str{Set: tc.set, Value: tc.value}); got != tc.want {
			t.Errorf("UsableID(%q, set %v) = %v, want %v", tc.value, tc.set, got, tc.want)
		}
	}
	if !Fits(strings.Repeat("\u00e9", MaxToolNameLength), MaxToolNameLength) {
		t.Error("a tool name of the limit in characters (twice as many bytes) must fit")
	}
	if Fits(strings.Repeat("x", MaxToolNameLength+1), MaxToolNameLength) {
		t.Error("a tool name over the limit must not fit")
	}
}
