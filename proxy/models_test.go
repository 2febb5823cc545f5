package proxy_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/kvtest"
)

// modelsEngine is an engine whose GET /v1/models answers list (the "data"
// array's items) as given.
func modelsEngine(t *testing.T, list ...string) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health":
		case "/metrics":
			_, _ = io.WriteString(w, "vllm:num_requests_waiting 0\nvllm:num_requests_running 0\n")
		case "/v1/models":
			w.Header().Set("Content-Type", "application/json")
			_, _ = fmt.Fprintf(w, `{"object":"list","data":[%s]}`, strings.Join(list, ","))
		default:
			kvtest.Echo(w, r, nil)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// get GETs url with the test's context and reads and closes the answer's
// body.
//
//bodyclose:handled
func get(t *testing.T, url string) (*http.Response, []byte) {
	t.Helper()
	resp, err := httpGet(t, url)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

func TestModelsAsTheReplicasSayThem(t *testing.T) {
	const (
		base  = `{"id":"meta-llama/Llama-3.1-8B-Instruct","object":"model","created":1700000000,"owned_by":"vllm","root":"/models/llama","parent":null,"max_model_len":131072,"permission":[{"id":"modelperm-1","object":"model_permission","allow_sampling":true}]}`
		lora  = `{"id":"sql-lora","object":"model","created":1700000001,"owned_by":"vllm","root":"/adapters/sql","parent":"meta-llama/Llama-3.1-8B-Instruct","max_model_len":131072}`
		baseB = `{"id":"meta-llama/Llama-3.1-8B-Instruct","object":"model","created":1,"owned_by":"other","max_model_len":8192}`
		small = `{"id":"qwen-0.5b","object":"model","created":1700000002,"owned_by":"sglang","root":"qwen","max_model_len":32768}`
	)
	a := modelsEngine(t, base, lora)
	b := modelsEngine(t, baseB, small)
	k := kvtest.Start(t, nil, func(c *config.Config) {
		c.Backends = []config.Backend{
			{Name: "a", URL: a.URL, Engine: "vllm"},
			{Name: "b", URL: b.URL, Engine: "vllm"},
			{Name: "s", URL: kvtest.DeadURL(t), Engine: "vllm", Models: []string{"static-x", "sql-lora"}},
		}
	})

	resp, body := get(t, k.URL+"/v1/models")
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("status %d, content type %q: %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	var list struct {
		Object string            `json:"object"`
		Data   []json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(body, &list); err != nil || list.Object != "list" {
		t.Fatalf("not a model list (%v): %s", err, body)
	}
	// Sorted by id, each object as the first replica in fleet order that
	// lists it sent it; static entries are minimal.
	want := []string{base, small, lora}
	if len(list.Data) != 4 {
		t.Fatalf("%d models: %s", len(list.Data), body)
	}
	for i, w := range want {
		if string(list.Data[i]) != w {
			t.Errorf("model %d:\n got %s\nwant %s", i, list.Data[i], w)
		}
	}
	var st map[string]any
	if err := json.Unmarshal(list.Data[3], &st); err != nil || st["id"] != "static-x" || st["object"] != "model" || st["owned_by"] != "kvroute" {
		t.Errorf("static model: %s", list.Data[3])
	}

	for _, c := range []struct{ id, want string }{
		{"meta-llama/Llama-3.1-8B-Instruct", base},
		{"sql-lora", lora},
		{"qwen-0.5b", small},
	} {
		resp, body := get(t, k.URL+"/v1/models/"+c.id)
		if resp.StatusCode != http.StatusOK || string(body) != c.want || resp.Header.Get("Content-Type") != "application/json" {
			t.Errorf("GET /v1/models/%s: %d %q %s", c.id, resp.StatusCode, resp.Header.Get("Content-Type"), body)
		}
		if resp.Header.Get("X-Kvroute-Backend") != "" {
			t.Errorf("GET /v1/models/%s went to a replica", c.id)
		}
	}
	for _, id := range []string{"nope", "meta-llama", "sql-lora/x"} {
		resp, body := get(t, k.URL+"/v1/models/"+id)
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET /v1/models/%s: status %d %s", id, resp.StatusCode, body)
			continue
		}
		assertOpenAIError(t, body, "model_not_found")
		var e struct {
			Error struct {
				Param   string `json:"param"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal(body, &e); err != nil || e.Error.Param != "model" || !strings.Contains(e.Error.Message, "'"+id+"'") {
			t.Errorf("404 body %s", body)
		}
	}
}
