package oai

import "testing"

// vLLM's priority field is read when it is an integer in 32 bits; any
// other value is left to the engine and read as none.
func TestParsePriority(t *testing.T) {
	cases := []struct {
		value string
		want  int
		has   bool
	}{
		{`-3`, -3, true},
		{`0`, 0, true},
		{`7`, 7, true},
		{`2147483647`, 1<<31 - 1, true},
		{`-2147483648`, -1 << 31, true},
		{`2147483648`, 0, false},
		{`5.5`, 0, false},
		{`1e3`, 0, false},
		{`"1"`, 0, false},
		{`null`, 0, false},
		{`[1]`, 0, false},
	}
	for _, c := range cases {
		t.Run(c.value, func(t *testing.T) {
			body := `{"model":"m","priority":` + c.value + `,"messages":[{"role":"user","content":"hi"}]}`
			req, err := Parse(KindChat, []byte(body))
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			if req.Priority != c.want || req.HasPriority != c.has {
				t.Fatalf("priority %d (%v), want %d (%v)", req.Priority, req.HasPriority, c.want, c.has)
			}
		})
	}
	// Only the first of repeated keys is read, as for every field.
	req, err := Parse(KindCompletion, []byte(`{"model":"m","prompt":"x","priority":2,"priority":-9}`))
	if err != nil || req.Priority != 2 || !req.HasPriority {
		t.Fatalf("repeated: %+v %v", req, err)
	}
}
