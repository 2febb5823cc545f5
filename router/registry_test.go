package router

import (
	"os"
	"strings"
	"testing"
)

// The README's table of routing policies is the registry's: one row per
// registered policy, with its summary.
func TestReadmeListsThePolicies(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	for _, e := range Policies() {
		row := "| `" + e.Name + "`"
		i := strings.Index(readme, row)
		if i < 0 {
			t.Errorf("README has no row for policy %s", e.Name)
			continue
		}
		line := readme[i:]
		line = line[:strings.IndexByte(line, '\n')]
		if !strings.HasSuffix(line, "| "+e.Summary+" |") {
			t.Errorf("README row of %s:\n%s\nwant its summary:\n%s", e.Name, line, e.Summary)
		}
	}
}

func TestRegisterRefusesDuplicatesAndBlanks(t *testing.T) {
	if err := Register(Entry{Name: "round_robin", New: func(Deps) Policy { return LeastLoad{} }}); err == nil {
		t.Error("a second round_robin was registered")
	}
	if err := Register(Entry{Name: "no_constructor"}); err == nil {
		t.Error("an entry without a constructor was registered")
	}
	if _, err := NewPolicy("nope", Deps{}); err == nil || !strings.Contains(err.Error(), "cache_aware, session, least_load, round_robin") {
		t.Errorf("unknown policy: %v, want the registered names listed", err)
	}
	for _, n := range Names() {
		p, err := NewPolicy(n, Deps{})
		if err != nil || p.Name() != n {
			t.Errorf("NewPolicy(%q) = %v, %v", n, p, err)
		}
	}
}
