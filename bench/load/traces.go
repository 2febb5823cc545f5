package load

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
)

// The public traces the workloads replay. The repository ships none of
// them: a user downloads one and names it with the --trace flag of the
// command that reads it. The addresses are pinned to the commits whose
// files the workloads were checked against.
const (
	// MooncakeTraceURL is the Mooncake FAST'25 conversation trace (JSON
	// lines; Apache-2.0), from github.com/kvcache-ai/Mooncake.
	MooncakeTraceURL = "https://github.com/kvcache-ai/Mooncake/raw/3b5a594133958449a1feaf1c9e0fc1b553e34a28/FAST25-release/traces/conversation_trace.jsonl"
	// MooncakeTracesPage lists the FAST'25 traces (conversation_trace.jsonl
	// and the others) in the Mooncake repository.
	MooncakeTracesPage = "https://github.com/kvcache-ai/Mooncake/tree/3b5a594133958449a1feaf1c9e0fc1b553e34a28/FAST25-release/traces"
	// AzureConvTraceURL and AzureCodeTraceURL are the Azure LLM inference
	// traces of 2023 (CSV of arrival time, context and generated tokens;
	// CC-BY-4.0), from github.com/Azure/AzurePublicDataset.
	AzureConvTraceURL = "https://github.com/Azure/AzurePublicDataset/raw/b469a113cedca53ddc3bdea71a143dc4b7d8700c/data/AzureLLMInferenceTrace_conv.csv"
	AzureCodeTraceURL = "https://github.com/Azure/AzurePublicDataset/raw/b469a113cedca53ddc3bdea71a143dc4b7d8700c/data/AzureLLMInferenceTrace_code.csv"
)

// TraceKind names a trace format.
type TraceKind string

// The trace formats the workloads read.
const (
	TraceMooncake TraceKind = "mooncake"
	TraceAzure    TraceKind = "azure"
)

// TraceError reports a trace that a run needs but was not given (Path is
// empty) or whose file does not exist. Its message says where to download
// the trace and which flag takes it.
type TraceError struct {
	Kind TraceKind
	// Path is the path given; empty when none was.
	Path string
	// For says what needs the trace ("the mooncake workload"); empty
	// leaves it out.
	For string
	// Err is the error opening Path, if any.
	Err error
}

func (e *TraceError) Error() string {
	var b strings.Builder
	what, urls, page := "the Mooncake FAST'25 conversation trace (conversation_trace.jsonl)",
		[]string{MooncakeTraceURL}, "from github.com/kvcache-ai/Mooncake, FAST25-release/traces: "+MooncakeTracesPage
	if e.Kind == TraceAzure {
		what, urls, page = "an Azure LLM inference trace (AzureLLMInferenceTrace_conv.csv or _code.csv)",
			[]string{AzureConvTraceURL, AzureCodeTraceURL}, "from github.com/Azure/AzurePublicDataset, data/"
	}
	switch {
	case e.Path == "" && e.For != "":
		fmt.Fprintf(&b, "%s needs %s and no --trace was given", e.For, what)
	case e.Path == "":
		fmt.Fprintf(&b, "no --trace was given for %s", what)
	default:
		fmt.Fprintf(&b, "trace %s: no such file; it should be %s", e.Path, what)
	}
	b.WriteString("; download it and pass its path with --trace:")
	for _, u := range urls {
		b.WriteString("\n  curl -LO " + u)
	}
	b.WriteString("\n(" + page + ")")
	return b.String()
}

func (e *TraceError) Unwrap() error { return e.Err }

// CheckTrace returns a *TraceError when path is empty or names no file, and
// nil when the file exists; other errors are left to the reader.
// forWhat says what needs the trace, for the message.
func CheckTrace(kind TraceKind, path, forWhat string) error {
	if path == "" {
		return &TraceError{Kind: kind, For: forWhat}
	}
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return &TraceError{Kind: kind, Path: path, For: forWhat, Err: err}
	}
	return nil
}

// openTrace opens the trace at path, turning a missing path or file into a
// *TraceError.
func openTrace(kind TraceKind, path string) (*os.File, error) {
	if path == "" {
		return nil, &TraceError{Kind: kind}
	}
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, &TraceError{Kind: kind, Path: path, Err: err}
	}
	return f, err
}
