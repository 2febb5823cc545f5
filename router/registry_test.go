package router

import (
	"strings"
	"testing"
)

func TestRegisterRefusesDuplicatesAndBlanks(t *testing.T) {
	if err := Register(Module[NoConfig]{Name: "round_robin", New: func(Deps, *Live[NoConfig]) Policy { return LeastLoad{} }}); err == nil {
		t.Error("a second round_robin was registered")
	}
	if err := Register(Module[NoConfig]{Name: "no_constructor"}); err == nil {
		t.Error("an entry without a constructor was registered")
	}
	if _, err := NewPolicy("nope", Deps{}); err == nil || !strings.Contains(err.Error(), strings.Join(Names(), ", ")) {
		t.Errorf("unknown policy: %v, want the registered names listed", err)
	}
	for _, n := range Names() {
		p, err := NewPolicy(n, Deps{})
		if err != nil || p.Name() != n {
			t.Errorf("NewPolicy(%q) = %v, %v", n, p, err)
		}
	}
}
