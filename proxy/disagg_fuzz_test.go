package proxy

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/kvroute/kvroute/oai"
)

// FuzzTransferParams feeds arbitrary prefill answers (a replica's bytes)
// to the vLLM pairing: taking kv_transfer_params from an answer never
// panics, yields a JSON object when it succeeds, and the decode body built
// with it carries exactly that object.
func FuzzTransferParams(f *testing.F) {
	f.Add([]byte(`{"id":"x","kv_transfer_params":{"do_remote_prefill":true,"remote_engine_id":"e","remote_block_ids":[1,2],"remote_host":"10.0.0.1","remote_port":5600}}`))
	f.Add([]byte(`{"kv_transfer_params":null}`))
	f.Add([]byte(`{"kv_transfer_params":{"a":"\u00e9\ud83d\ude00"},"kv_transfer_params":{"b":1e400}}`))
	f.Add([]byte(`[{"kv_transfer_params":{}}]`))
	f.Add([]byte(`{"kv_transfer_params":{"x":[[[[[[[[[[]]]]]]]]]]}}`))
	const client = `{"model":"m","messages":[{"role":"user","content":"hi"}],"kv_transfer_params":{"remote_host":"evil"}}`
	f.Fuzz(func(t *testing.T, answer []byte) {
		params, err := transferParams(answer)
		if err != nil {
			return
		}
		if !json.Valid(params) || params[0] != '{' {
			t.Fatalf("params %q are not a JSON object", params)
		}
		body, err := decodeBody([]byte(client), params)
		if err != nil {
			t.Fatalf("decode body with %q: %v", params, err)
		}
		var got struct {
			Params json.RawMessage `json:"kv_transfer_params"`
			Model  string          `json:"model"`
		}
		if err := json.Unmarshal(body, &got); err != nil || got.Model != "m" {
			t.Fatalf("decode body %q: %v", body, err)
		}
		if !bytes.Equal(got.Params, params) {
			t.Fatalf("decode body carries %q, want %q", got.Params, params)
		}
	})
}

// FuzzPairingBodies feeds arbitrary client bodies to the builders of the
// bodies sent to prefill and decode replicas: they never panic, and what
// they build is a JSON object without the client's pairing fields.
func FuzzPairingBodies(f *testing.F) {
	f.Add([]byte(`{"model":"m","prompt":"hi","stream":true,"stream_options":{"include_usage":true}}`))
	f.Add([]byte(`{"model":"m","bootstrap_room":1,"bootstrap_room":2,"bootstrap\u005froom":3}`))
	f.Add([]byte(`{"kv_transfer_params":{"remote_host":"evil"},"kv_transfer_params":[]}`))
	f.Add([]byte(`"not an object"`))
	f.Fuzz(func(t *testing.T, body []byte) {
		builds := []func() ([]byte, error){
			func() ([]byte, error) { return prefillBody(body, oai.KindChat) },
			func() ([]byte, error) { return bootstrapBody(body, "10.0.0.1", 8998, 1<<62) },
			func() ([]byte, error) { return decodeBody(body, []byte(`{"remote_engine_id":"e"}`)) },
		}
		for i, build := range builds {
			out, err := build()
			if err != nil {
				continue
			}
			var fields map[string]json.RawMessage
			if err := json.Unmarshal(out, &fields); err != nil {
				t.Fatalf("build %d of %q: %q is no JSON object: %v", i, body, out, err)
			}
			if r := fields["bootstrap_room"]; r != nil && string(r) != "4611686018427387904" {
				t.Fatalf("build %d kept a client's room: %s", i, r)
			}
			if p := fields["kv_transfer_params"]; p != nil && bytes.Contains(p, []byte("evil")) {
				t.Fatalf("build %d kept a client's kv_transfer_params: %s", i, p)
			}
		}
	})
}
