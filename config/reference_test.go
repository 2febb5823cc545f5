package config

import (
	"os"
	"strings"
	"testing"
)

const referencePage = "../docs/configuration.md"

// docs/configuration.md is what go run ./config/gen writes: the field
// comments, the defaults and the page agree.
func TestReferenceIsCurrent(t *testing.T) {
	page, err := os.ReadFile(referencePage)
	if err != nil {
		t.Fatal(err)
	}
	want, err := Reference(".", page)
	if err != nil {
		t.Fatalf("the reference cannot be generated: %v", err)
	}
	if string(want) == string(page) {
		return
	}
	have, wantLines := strings.Split(string(page), "\n"), strings.Split(string(want), "\n")
	for i := range wantLines {
		if i >= len(have) || have[i] != wantLines[i] {
			var line string
			if i < len(have) {
				line = have[i]
			}
			t.Fatalf("docs/configuration.md is not current at %s (line %d); regenerate it with: go run ./config/gen\n have: %s\n want: %s",
				lineKey(wantLines, i), i+1, line, wantLines[i])
		}
	}
	t.Fatalf("docs/configuration.md has lines past the generated page's end; regenerate it with: go run ./config/gen")
}

// lineKey names the key of the reference's line i, or its section.
func lineKey(lines []string, i int) string {
	if k, ok := strings.CutPrefix(lines[i], "| `"); ok {
		k, _, _ = strings.Cut(k, "`")
		return "key " + k
	}
	for ; i >= 0; i-- {
		if s, ok := strings.CutPrefix(lines[i], "## "); ok {
			return "section " + s
		}
	}
	return "the top of the page"
}

// A comment whose default is missing, or is not the one in Defaults, stops
// the generator with the key.
func TestReferenceChecksDefaults(t *testing.T) {
	cases := []struct {
		doc, want, cell, err string
	}{
		{"Connect is the dial timeout. Default 2s.", "2s", "`2s`", ""},
		{`Listen is the address. Default "127.0.0.1:8080".`, "127.0.0.1:8080", "`127.0.0.1:8080`", ""},
		{"MaxBodyBytes is the largest body. Default 8388608 (8 MiB).", "8388608", "`8388608` (8 MiB)", ""},
		{"CAFile is a bundle. Default empty: the system roots.", "empty", "empty: the system roots", ""},
		{"Nu is a price. Default 0.1. Below 1.", "0.1", "`0.1`", ""},
		{"Retries is a count. Default 10.", "1", "", `says "Default 10" but Defaults has 1`},
		{"Epsilon bounds load. Default 0.5.", "0.25", "", `says "Default 0.5" but Defaults has 0.25`},
		{"Level is debug, info (default) or warn.", "info", "", `states no default; add the sentence "Default info."`},
	}
	b := &refBuilder{}
	for _, c := range cases {
		_, stated, found := splitDefault(c.doc)
		cell, err := b.defaultCell(c.want, stated, found)
		switch {
		case c.err == "" && (err != nil || cell != c.cell):
			t.Errorf("%q: got %q, %v; want %q", c.doc, cell, err, c.cell)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%q: got error %v; want one containing %q", c.doc, err, c.err)
		}
	}
}

// splitDefault takes the default's sentence out of a comment wherever it
// stands, and only a sentence that begins with "Default".
func TestSplitDefault(t *testing.T) {
	cases := []struct{ doc, rest, stated string }{
		{"StreamIdle is the longest silence. Default 60s. A stream is cut.", "StreamIdle is the longest silence. A stream is cut.", "60s"},
		{"Enabled turns it on. Default false.", "Enabled turns it on.", "false"},
		{"UpstreamTLS overrides them. Default: none.", "UpstreamTLS overrides them.", "none"},
		{"BlockSize is used when metrics say no default_budget_tokens.", "BlockSize is used when metrics say no default_budget_tokens.", ""},
	}
	for _, c := range cases {
		rest, stated, _ := splitDefault(c.doc)
		if rest != c.rest || stated != c.stated {
			t.Errorf("%q: got %q, %q; want %q, %q", c.doc, rest, stated, c.rest, c.stated)
		}
	}
}

// The README's table of policies is the registry's, as go run ./config/gen
// writes it.
func TestReadmePolicyTableIsCurrent(t *testing.T) {
	page, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	want, err := ReadmePolicies(page)
	if err != nil {
		t.Fatal(err)
	}
	if string(want) != string(page) {
		t.Fatal("README.md's table of policies is not the registry's; regenerate it with: go run ./config/gen")
	}
}
