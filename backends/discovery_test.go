package backends

import (
	"context"
	"errors"
	"reflect"
	"testing"
)

type fakeResolver map[string][]string

func (f fakeResolver) LookupHost(_ context.Context, host string) ([]string, error) {
	if a, ok := f[host]; ok {
		return a, nil
	}
	return nil, errors.New("no such host")
}

func TestExpand(t *testing.T) {
	specs := []Spec{
		{Name: "static", URL: "http://127.0.0.1:9000", Engine: EngineVLLM},
		{Name: "vllm", URL: "http://vllm-headless.default.svc:8000", Engine: EngineVLLM, Discover: true, Models: []string{"m"}},
	}
	r := fakeResolver{"vllm-headless.default.svc": {"127.0.0.3", "127.0.0.2", "::1", "127.0.0.2"}}
	got, err := Expand(context.Background(), specs, r)
	if err != nil {
		t.Fatal(err)
	}
	names, urls := make([]string, 0, len(got)), make([]string, 0, len(got))
	for _, s := range got {
		names = append(names, s.Name)
		urls = append(urls, s.URL)
		if s.Discover {
			t.Error("expanded spec still marked Discover")
		}
	}
	wantNames := []string{"static", "vllm-127.0.0.2", "vllm-127.0.0.3", "vllm-::1"}
	wantURLs := []string{"http://127.0.0.1:9000", "http://127.0.0.2:8000", "http://127.0.0.3:8000", "http://[::1]:8000"}
	if !reflect.DeepEqual(names, wantNames) || !reflect.DeepEqual(urls, wantURLs) {
		t.Errorf("got %v %v", names, urls)
	}
	if err := ValidateSpecs(got); err != nil {
		t.Errorf("expanded specs invalid: %v", err)
	}
	// Each address of an engine of ranks is one replica per rank.
	got, err = Expand(context.Background(), []Spec{{Name: "dp", URL: "http://vllm-headless.default.svc:8000", Engine: EngineVLLM,
		Discover: true, DataParallelSize: 2, KVEvents: KVEvents{Endpoint: "tcp://*:5557"}}}, r)
	if err != nil {
		t.Fatal(err)
	}
	names = names[:0]
	for _, s := range got {
		names = append(names, s.Name+" "+s.URL+" "+s.KVEvents.Endpoint)
	}
	wantNames = []string{
		"dp-127.0.0.2-dp0 http://127.0.0.2:8000 tcp://*:5557", "dp-127.0.0.2-dp1 http://127.0.0.2:8000 tcp://*:5558",
		"dp-127.0.0.3-dp0 http://127.0.0.3:8000 tcp://*:5557", "dp-127.0.0.3-dp1 http://127.0.0.3:8000 tcp://*:5558",
		"dp-::1-dp0 http://[::1]:8000 tcp://*:5557", "dp-::1-dp1 http://[::1]:8000 tcp://*:5558",
	}
	if !reflect.DeepEqual(names, wantNames) {
		t.Errorf("got %q", names)
	}
	_, err = Expand(context.Background(), []Spec{{Name: "x", URL: "http://gone:1", Discover: true, Engine: EngineVLLM}}, r)
	if err == nil {
		t.Error("unresolvable name gave no error")
	}
}
