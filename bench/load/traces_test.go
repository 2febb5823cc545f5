package load

import (
	"errors"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// A trace that is not given, or names no file, is an error that says where
// to download it and which flag takes it.
func TestMissingTraceSaysWhereToDownload(t *testing.T) {
	absent := filepath.Join(t.TempDir(), "conversation_trace.jsonl")
	cases := []struct {
		name     string
		run      func() error
		urls     []string
		notExist bool // the file was given but does not exist
	}{
		{"mooncake, no path", func() error { _, err := Mooncake("", MooncakeOptions{}); return err },
			[]string{MooncakeTraceURL, "github.com/kvcache-ai/Mooncake"}, false},
		{"mooncake, absent file", func() error { _, err := Mooncake(absent, MooncakeOptions{}); return err },
			[]string{MooncakeTraceURL, "github.com/kvcache-ai/Mooncake", absent}, true},
		{"azure, absent file", func() error { _, err := NoReuse(NoReuseOptions{N: 3, AzurePath: absent}); return err },
			[]string{AzureConvTraceURL, AzureCodeTraceURL, "github.com/Azure/AzurePublicDataset", absent}, true},
		{"azure arrivals, no path", func() error { _, err := NoReuse(NoReuseOptions{N: 3, TraceArrivals: true}); return err },
			[]string{AzureConvTraceURL, "github.com/Azure/AzurePublicDataset"}, false},
		{"check, no path", func() error { return CheckTrace(TraceMooncake, "", "the mooncake workload") },
			[]string{MooncakeTraceURL, "the mooncake workload needs"}, false},
		{"check, absent file", func() error { return CheckTrace(TraceAzure, absent, "noreuse") },
			[]string{AzureConvTraceURL, absent}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.run()
			var te *TraceError
			if !errors.As(err, &te) {
				t.Fatalf("got %v, want a *TraceError", err)
			}
			msg := err.Error()
			for _, want := range append(c.urls, "--trace", "curl -LO https://") {
				if !strings.Contains(msg, want) {
					t.Errorf("message lacks %q:\n%s", want, msg)
				}
			}
			if c.notExist != errors.Is(err, fs.ErrNotExist) {
				t.Errorf("errors.Is(err, fs.ErrNotExist) = %v", !c.notExist)
			}
		})
	}
	if err := CheckTrace(TraceMooncake, absent[:len(absent)-len("conversation_trace.jsonl")], "x"); err != nil {
		t.Errorf("an existing path was refused: %v", err)
	}
}
