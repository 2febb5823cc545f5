package benchcmd

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/bench/load"
	"github.com/kvroute/kvroute/bench/runner"
	"github.com/kvroute/kvroute/cli"
)

// runCLI runs the kvroute command line, as main.go assembles it, with args
// and returns its error and what it printed.
func runCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := cli.NewRoot(Commands()...)
	var out bytes.Buffer
	root.SetArgs(args)
	root.SetOut(&out)
	root.SetErr(&out)
	err := root.Execute()
	return out.String(), err
}

// firstByteDelay is how long the fake endpoint waits before its first
// token: a TTFT the report must show as measured, not divided by the
// simulator's default time scale (0.1, which would report ten times more).
const firstByteDelay = 300 * time.Millisecond

// startFakeEndpoint serves an OpenAI-compatible streaming chat endpoint on
// 127.0.0.1 that answers every request after firstByteDelay with one
// content token, usage with cached tokens and [DONE].
func startFakeEndpoint(t *testing.T) (url string, served *atomic.Int64) {
	t.Helper()
	served = new(atomic.Int64)
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Model  string `json:"model"`
			Stream bool   `json:"stream"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil || !body.Stream || body.Model != "fake-model" {
			http.Error(w, `{"error":{"message":"want a streamed request for fake-model","type":"invalid_request_error"}}`, http.StatusBadRequest)
			return
		}
		time.Sleep(firstByteDelay)
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("X-Kvroute-Backend", "fake-0")
		_, _ = fmt.Fprint(w, `data: {"choices":[{"index":0,"delta":{"content":" hi"}}]}`+"\n\n")
		_, _ = fmt.Fprint(w, `data: {"choices":[],"usage":{"prompt_tokens":100,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":25}}}`+"\n\n")
		_, _ = fmt.Fprint(w, "data: [DONE]\n\n")
		served.Add(1)
	})
	var lc net.ListenConfig
	ln, err := lc.Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String(), served
}

// bench --url replays in real time (time scale 1, whatever the simulator's
// default) and writes its report files into --out.
func TestBenchURLRunsInRealTimeAndWritesOut(t *testing.T) {
	url, served := startFakeEndpoint(t)
	out := filepath.Join(t.TempDir(), "fleet")
	const n = 4
	printed, err := runCLI(t, "bench", "--url", url+"/", "--model", "fake-model", "--workload", "hotprefix",
		"--requests", fmt.Sprint(n), "--rate", "20", "--prefix-tokens", "64", "--suffix-tokens", "16", "--max-tokens", "1",
		"--no-progress", "--out", out)
	if err != nil {
		t.Fatalf("bench --url: %v\n%s", err, printed)
	}
	if got := served.Load(); got != n {
		t.Fatalf("endpoint served %d requests, want %d", got, n)
	}
	for _, name := range []string{runner.FileMarkdown, runner.FileJSON, runner.FileSVG} {
		if fi, err := os.Stat(filepath.Join(out, name)); err != nil || fi.Size() == 0 {
			t.Errorf("--out lacks %s: %v", name, err)
		}
	}
	raw, err := os.ReadFile(filepath.Join(out, runner.FileJSON))
	if err != nil {
		t.Fatal(err)
	}
	var rep runner.Report
	if err := json.Unmarshal(raw, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.TimeScale != 1 {
		t.Errorf("time scale %v, want 1 (real time)", rep.TimeScale)
	}
	if rep.Target != url || len(rep.Results) != 1 {
		t.Fatalf("target %q with %d results, want %q with 1", rep.Target, len(rep.Results), url)
	}
	s := rep.Results[0].Summary
	if s.OK != n || s.Requests != n {
		t.Fatalf("%d/%d ok, want %d/%d", s.OK, s.Requests, n, n)
	}
	// The TTFT is at least the endpoint's delay, and not inflated tenfold
	// by a time scale that belongs to the simulator.
	if lo, hi := firstByteDelay.Seconds(), 10*firstByteDelay.Seconds(); s.TTFT.P50 < lo || s.TTFT.P50 >= hi {
		t.Errorf("TTFT p50 %.3fs, want the measured time: at least %.1fs and under %.1fs", s.TTFT.P50, lo, hi)
	}
	if s.CachedReported != n || s.ReportedHitRate != 0.25 {
		t.Errorf("reported hit rate %v over %d requests, want 0.25 over %d", s.ReportedHitRate, s.CachedReported, n)
	}
	md, _ := os.ReadFile(filepath.Join(out, runner.FileMarkdown))
	for _, want := range []string{"against " + url, "in real time", "| " + url + " | 4/4 | 0 | 25.0 %", "fake-0"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("%s lacks %q:\n%s", runner.FileMarkdown, want, md)
		}
	}
	if !strings.Contains(printed, "| "+url+" | 4/4") {
		t.Errorf("printed report lacks the endpoint's row:\n%s", printed)
	}
}

// The flags that configure the simulated fleet are refused with --url
// instead of silently changing nothing (or, for --time-scale, the times).
func TestBenchURLRefusesSimulatorFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--time-scale", "0.1"},
		{"--replicas", "2"},
		{"--routers", "nginx"},
		{"--precise"},
	} {
		flag := args[0]
		_, err := runCLI(t, append([]string{"bench", "--url", "http://127.0.0.1:1", "--workload", "hotprefix", "--out", ""}, args...)...)
		if err == nil || !strings.Contains(err.Error(), flag) || !strings.Contains(err.Error(), "real time") {
			t.Errorf("bench --url %s: got %v, want an error naming %s and real time", strings.Join(args, " "), err, flag)
		}
	}
}

// Every command that reads a trace fails, when it is not given or names no
// file, with an error that says where to download it and the flag to pass.
func TestMissingTraceNamesDownloadURLs(t *testing.T) {
	dir := t.TempDir()
	absentJSONL := filepath.Join(dir, "conversation_trace.jsonl")
	absentCSV := filepath.Join(dir, "AzureLLMInferenceTrace_conv.csv")
	mooncake := []string{load.MooncakeTraceURL, "github.com/kvcache-ai/Mooncake", "--trace"}
	azure := []string{load.AzureConvTraceURL, load.AzureCodeTraceURL, "github.com/Azure/AzurePublicDataset", "--trace"}
	out := filepath.Join(dir, "out")
	cases := []struct {
		name string
		args []string
		want []string
	}{
		{"bench mooncake, no --trace", []string{"bench", "--workload", "mooncake", "--out", out}, mooncake},
		{"bench mooncake, absent file", []string{"bench", "--workload", "mooncake", "--trace", absentJSONL, "--out", out}, append(mooncake, absentJSONL)},
		{"bench --url mooncake, no --trace", []string{"bench", "--url", "http://127.0.0.1:1", "--workload", "mooncake", "--out", out}, mooncake},
		{"bench --url mooncake, absent file", []string{"bench", "--url", "http://127.0.0.1:1", "--workload", "mooncake", "--trace", absentJSONL, "--out", out}, append(mooncake, absentJSONL)},
		{"bench noreuse, absent file", []string{"bench", "--workload", "noreuse", "--trace", absentCSV, "--out", out}, append(azure, absentCSV)},
		{"bench noreuse --trace-arrivals, no --trace", []string{"bench", "--workload", "noreuse", "--trace-arrivals", "--out", out}, azure},
		{"bench noreuse --url, absent file", []string{"bench", "--url", "http://127.0.0.1:1", "--workload", "noreuse", "--trace", absentCSV, "--out", out}, append(azure, absentCSV)},
		{"bench flood, absent file", []string{"bench", "flood", "--trace", absentJSONL}, append(mooncake, absentJSONL)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := runCLI(t, c.args...)
			if err == nil {
				t.Fatal("no error")
			}
			for _, want := range c.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error lacks %q:\n%v", want, err)
				}
			}
		})
	}
	if _, err := os.Stat(out); err == nil {
		t.Error("a run without its trace created --out")
	}
	_, err := runCLI(t, "bench", "--workload", "multiturn", "--trace", absentJSONL, "--out", out)
	if err == nil || !strings.Contains(err.Error(), "reads no trace") {
		t.Errorf("--trace with multiturn: got %v, want an error saying it reads no trace", err)
	}
}

func TestSimRoles(t *testing.T) {
	cases := []struct {
		list     []string
		replicas int
		want     string
		err      string
	}{
		{nil, 4, "", ""},
		{[]string{"decode"}, 3, "decode,decode,decode", ""},
		{[]string{"prefill", "decode", "both"}, 3, "prefill,decode,both", ""},
		{[]string{"prefill", "decode"}, 3, "", "2 roles for 3 replicas"},
		{[]string{"prefil"}, 2, "", `unknown role "prefil"`},
	}
	for _, tc := range cases {
		got, err := simRoles(tc.list, tc.replicas)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("simRoles(%v, %d): err %v, want %q", tc.list, tc.replicas, err, tc.err)
			}
			continue
		}
		if err != nil || strings.Join(got, ",") != tc.want {
			t.Errorf("simRoles(%v, %d) = %v, %v; want %s", tc.list, tc.replicas, got, err, tc.want)
		}
	}
}

// The noisy workload runs on its own small, unhurried fleet unless
// --replicas or --time-scale say otherwise; other workloads keep theirs.
func TestNoisyFleetDefaults(t *testing.T) {
	for _, c := range []struct {
		workload string
		changed  []string
		replicas int
		scale    float64
	}{
		{"noisy", nil, runner.NoisyReplicas, runner.NoisyTimeScale},
		{"noisy", []string{"replicas"}, 8, runner.NoisyTimeScale},
		{"noisy", []string{"replicas", "time-scale"}, 8, 0.1},
		{"multiturn", nil, 8, 0.1},
	} {
		o := runner.DefaultOptions()
		o.Workload = c.workload
		noisyFleet(&o, func(name string) bool { return slices.Contains(c.changed, name) })
		if o.Replicas != c.replicas || o.TimeScale != c.scale {
			t.Errorf("%s, %v given: %d replicas, time scale %g; want %d, %g", c.workload, c.changed, o.Replicas, o.TimeScale, c.replicas, c.scale)
		}
	}
}

// bench --url replays the noisy workload at the rates given, and splits
// its report by tenant; without both rates it refuses, the endpoint's
// capacity being unknown.
func TestBenchURLNoisy(t *testing.T) {
	url, served := startFakeEndpoint(t)
	base := []string{"bench", "--url", url, "--model", "fake-model", "--workload", "noisy", "--out", "",
		"--noisy-warmup", "500ms", "--noisy-flood", "1s", "--noisy-cooldown", "500ms"}
	if _, err := runCLI(t, append(base, "--noisy-victim-rate", "4")...); err == nil || !strings.Contains(err.Error(), "--noisy-aggressor-rate") {
		t.Fatalf("no aggressor rate: %v, want an error naming --noisy-aggressor-rate", err)
	}
	out, err := runCLI(t, append(base, "--noisy-victim-rate", "4", "--noisy-aggressor-rate", "12")...)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{"### Noisy neighbour", "| " + url + " | victim |", "| " + url + " | aggressor |", "in seconds"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if served.Load() == 0 {
		t.Error("the endpoint served nothing")
	}
}
