package sim

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"
)

// roleFleet starts one replica per role with mod applied to fastConfig.
func roleFleet(t *testing.T, mod func(*Config), roles ...string) *Fleet {
	t.Helper()
	cfg := fastConfig()
	if mod != nil {
		mod(&cfg)
	}
	f, err := StartRoleFleet(context.Background(), roles, 0, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	return f
}

// vLLM's protocol: the prefill replica computes the prompt and answers
// kv_transfer_params naming itself and the prompt's blocks; the decode
// replica given them receives the prompt's KV at TransferTokenMs a token
// (in less simulated time than the prefill took) and counts it as
// transferred, not as queried.
func TestVLLMPrefillAndDecode(t *testing.T) {
	f := roleFleet(t, func(c *Config) {
		c.PrefillTokenMs, c.TransferTokenMs, c.MaxBatchedTokens = 0.03, 0.003, 1<<20
	}, RolePrefill, RoleDecode)
	p := prompt("pd", 4000)
	code, out := post(t, f.URLs[0], "/v1/completions", map[string]any{
		"prompt": p, "max_tokens": 1, "stream": false,
		"kv_transfer_params": map[string]any{"do_remote_decode": true, "do_remote_prefill": false},
	})
	if code != 200 {
		t.Fatalf("prefill: %d %s", code, out)
	}
	var pre struct {
		Usage  usage `json:"usage"`
		Params struct {
			DoRemotePrefill bool   `json:"do_remote_prefill"`
			Engine          string `json:"remote_engine_id"`
			Blocks          []int  `json:"remote_block_ids"`
		} `json:"kv_transfer_params"`
	}
	if err := json.Unmarshal(out, &pre); err != nil {
		t.Fatal(err)
	}
	bs := f.Replicas[0].Config().BlockSize
	if !pre.Params.DoRemotePrefill || pre.Params.Engine != f.Replicas[0].Config().Name || len(pre.Params.Blocks) != pre.Usage.PromptTokens/bs || pre.Usage.CompletionTokens != 1 {
		t.Fatalf("prefill answer %s", out)
	}
	params, _ := json.Marshal(map[string]any{"do_remote_prefill": true, "remote_engine_id": pre.Params.Engine, "remote_block_ids": pre.Params.Blocks})
	c := complete(t, f.URLs[1], map[string]any{"prompt": p, "max_tokens": 5, "ignore_eos": true, "kv_transfer_params": json.RawMessage(params)})
	if c.Usage.CompletionTokens != 5 {
		t.Fatalf("decode answer usage %+v", c.Usage)
	}
	ps, ds := f.Replicas[0].Stats(), f.Replicas[1].Stats()
	if ps.PrefillTokens < int64(pre.Usage.PromptTokens) || ps.QueryTokens == 0 || ps.RemoteRequests != 0 {
		t.Errorf("prefill stats %+v", ps)
	}
	if ds.RemoteRequests != 1 || ds.TransferTokens != int64(pre.Usage.PromptTokens) || ds.PrefillTokens != 0 || ds.QueryTokens != 0 {
		t.Errorf("decode stats: remote %d, transferred %d of %d, prefilled %d, queried %d", ds.RemoteRequests, ds.TransferTokens, pre.Usage.PromptTokens, ds.PrefillTokens, ds.QueryTokens)
	}
	// Four extra decode steps on the decode side; the prompt's tokens at a
	// tenth of the price.
	if ds.BusyTime >= ps.BusyTime {
		t.Errorf("decode busy %v, prefill busy %v: receiving the KV should cost less than computing it", ds.BusyTime, ps.BusyTime)
	}
}

// SGLang's protocol: a decode replica given a bootstrap room waits for
// that room's prefill to end before it answers, even when it gets the
// request first; the prefill answers one token.
func TestSGLangRoomPairs(t *testing.T) {
	f := roleFleet(t, func(c *Config) { c.StepBaseMs = 20 }, RolePrefill, RoleDecode)
	body := func() map[string]any {
		return map[string]any{"prompt": prompt("room", 500), "max_tokens": 1, "ignore_eos": true,
			"bootstrap_host": "127.0.0.1", "bootstrap_port": 8998, "bootstrap_room": uint64(1) << 62}
	}
	var mu sync.Mutex
	var order []string
	var wg sync.WaitGroup
	run := func(name, url string) {
		defer wg.Done()
		c := complete(t, url, body())
		mu.Lock()
		order = append(order, name)
		mu.Unlock()
		if c.Usage.CompletionTokens != 1 {
			t.Errorf("%s usage %+v", name, c.Usage)
		}
	}
	wg.Add(2)
	go run("decode", f.URLs[1])
	time.Sleep(50 * time.Millisecond) // the decode request is waiting for its room first
	go run("prefill", f.URLs[0])
	wg.Wait()
	if strings.Join(order, ",") != "prefill,decode" {
		t.Errorf("answers in order %v: the decode must wait for its room's prefill", order)
	}
	if ds := f.Replicas[1].Stats(); ds.RemoteRequests != 1 || ds.QueryTokens != 0 {
		t.Errorf("decode stats %+v", ds)
	}
}
