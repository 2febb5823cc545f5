package oai

import (
	"strings"
	"testing"
)

func TestLookupString(t *testing.T) {
	big := `{"id":"resp_1","output":[{"id":"msg_9","content":"` + strings.Repeat("x", 5000) + `"}],"status":"completed"}`
	cases := []struct {
		name, body string
		path       []string
		want       string
		ok         bool
	}{
		{"top level", `{"id":"resp_1","object":"response"}`, []string{"id"}, "resp_1", true},
		{"after nested ids", `{"output":[{"id":"msg_1"}],"meta":{"id":"m"},"id":"resp_2"}`, []string{"id"}, "resp_2", true},
		{"nested", `{"type":"response.created","response":{"object":"response","id":"resp_3"}}`, []string{"response", "id"}, "resp_3", true},
		{"nested after a skipped object", `{"response":{"usage":{"id":"no"},"id":"resp_4"}}`, []string{"response", "id"}, "resp_4", true},
		{"first occurrence", `{"id":"a","id":"b"}`, []string{"id"}, "a", true},
		{"escaped key and value", `{"i\u0064":"r\u0065sp_5"}`, []string{"id"}, "resp_5", true},
		{"whitespace", " { \"id\" :\n \"resp_6\" } ", []string{"id"}, "resp_6", true},
		{"cut after the value", `{"response":{"id":"resp_7","instructions":"long`, []string{"response", "id"}, "resp_7", true},
		{"large body", big, []string{"id"}, "resp_1", true},
		{"large body, later key", big, []string{"status"}, "completed", true},
		{"missing", `{"object":"response"}`, []string{"id"}, "", false},
		{"not a string", `{"id":5}`, []string{"id"}, "", false},
		{"null", `{"id":null}`, []string{"id"}, "", false},
		{"parent not an object", `{"response":"x"}`, []string{"response", "id"}, "", false},
		{"not an object", `["id","x"]`, []string{"id"}, "", false},
		{"cut before the value", `{"object":"response","id":"res`, []string{"id"}, "", false},
		{"invalid before the value", `{"a":tru,"id":"x"}`, []string{"id"}, "", false},
		{"empty", ``, []string{"id"}, "", false},
		{"no path", `{"id":"x"}`, nil, "", false},
		{"deep", strings.Repeat(`{"a":`, 400) + `"x"` + strings.Repeat(`}`, 400), []string{"b"}, "", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, ok := LookupString([]byte(c.body), c.path...)
			if got != c.want || ok != c.ok {
				t.Errorf("LookupString(%q, %q) = %q, %v; want %q, %v", shorten(c.body), c.path, got, ok, c.want, c.ok)
			}
		})
	}
}

func TestLookupStringCopies(t *testing.T) {
	b := []byte(`{"id":"resp_1"}`)
	got, _ := LookupString(b, "id")
	copy(b, `{"id":"XXXXXX"}`)
	if got != "resp_1" {
		t.Errorf("the result aliases its input: %q", got)
	}
}

func TestParsePreviousResponseID(t *testing.T) {
	cases := []struct {
		name, body string
		kind       Kind
		want       string
	}{
		{"string", `{"model":"m","previous_response_id":"resp_1","input":"more"}`, KindResponses, "resp_1"},
		{"without input", `{"previous_response_id":"resp_2"}`, KindResponses, "resp_2"},
		{"escaped", `{"previous_response_id":"resp_\u0033","input":"x"}`, KindResponses, "resp_3"},
		{"first occurrence", `{"previous_response_id":"a","previous_response_id":"b","input":"x"}`, KindResponses, "a"},
		{"null", `{"previous_response_id":null,"input":"x"}`, KindResponses, ""},
		{"number left to the replica", `{"previous_response_id":7,"input":"x"}`, KindResponses, ""},
		{"not a responses request", `{"previous_response_id":"resp_1","messages":[{"role":"user","content":"x"}]}`, KindChat, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req, err := Parse(c.kind, []byte(c.body))
			if err != nil {
				t.Fatal(err)
			}
			if req.PreviousResponseID != c.want {
				t.Errorf("PreviousResponseID %q, want %q", req.PreviousResponseID, c.want)
			}
			var bufs Buffers
			if req, _ := bufs.Parse(c.kind, []byte(c.body)); req.PreviousResponseID != c.want {
				t.Errorf("with Buffers: PreviousResponseID %q, want %q", req.PreviousResponseID, c.want)
			}
		})
	}
	// Reading it costs nothing once the buffers are warm.
	body := []byte(`{"model":"m","previous_response_id":"resp_1","input":[{"role":"user","content":"next"}]}`)
	var bufs Buffers
	_, _ = bufs.Parse(KindResponses, body)
	if allocs := testing.AllocsPerRun(20, func() { _, _ = bufs.Parse(KindResponses, body) }); allocs != 0 {
		t.Errorf("reused buffers: %.0f allocations", allocs)
	}
}
