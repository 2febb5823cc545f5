package sim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestLoad measures the sim's CPU cost: SIM_LOAD=1 go test -run TestLoad -v
// [SIM_REPLICAS=8 SIM_CONC=400 SIM_SECONDS=10 SIM_SCALE=1 SIM_FLUSH=0s].
// It reports the process CPU time (sim servers and the load clients, which
// read every SSE event) per wall second.
func TestLoad(t *testing.T) {
	if os.Getenv("SIM_LOAD") == "" {
		t.Skip("set SIM_LOAD=1 to run the load measurement")
	}
	env := func(k string, d int) int {
		if v, err := strconv.Atoi(os.Getenv(k)); err == nil {
			return v
		}
		return d
	}
	replicas, conc, secs := env("SIM_REPLICAS", 8), env("SIM_CONC", 400), env("SIM_SECONDS", 10)
	scale := 1.0
	if v, err := strconv.ParseFloat(os.Getenv("SIM_SCALE"), 64); err == nil {
		scale = v
	}
	flush, _ := time.ParseDuration(os.Getenv("SIM_FLUSH"))
	cfg := Config{Preset: "llama-8b-h100", TimeScale: scale, StreamFlushInterval: flush}
	f, err := StartFleet(context.Background(), replicas, 0, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := &http.Transport{MaxIdleConnsPerHost: conc}
	cl := &http.Client{Transport: tr}
	defer tr.CloseIdleConnections()

	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(secs)*time.Second)
	defer cancel()
	var reqs, events atomic.Int64
	var wg sync.WaitGroup
	var ru0 syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru0); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for i := 0; i < conc; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			url := f.URLs[i%replicas]
			sys := prompt(fmt.Sprint("system", i%16), 4000)
			for turn := 0; ctx.Err() == nil; turn++ {
				body, _ := json.Marshal(map[string]any{
					"messages": []map[string]any{
						{"role": "system", "content": sys},
						{"role": "user", "content": prompt(fmt.Sprint("u", i, "t", turn), 4000)},
					},
					"max_tokens": 200, "ignore_eos": true, "stream": true,
				})
				req, _ := http.NewRequestWithContext(ctx, "POST", url+"/v1/chat/completions", bytes.NewReader(body))
				resp, err := cl.Do(req)
				if err != nil {
					return
				}
				sc := bufio.NewScanner(resp.Body)
				for sc.Scan() {
					if len(sc.Bytes()) > 0 {
						events.Add(1)
					}
				}
				_ = resp.Body.Close()
				reqs.Add(1)
			}
		}()
	}
	wg.Wait()
	wall := time.Since(start)
	var ru1 syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru1); err != nil {
		t.Fatal(err)
	}
	cpu := time.Duration(syscall.TimevalToNsec(ru1.Utime) - syscall.TimevalToNsec(ru0.Utime) +
		syscall.TimevalToNsec(ru1.Stime) - syscall.TimevalToNsec(ru0.Stime))
	var hit, query, gen, steps int64
	for _, r := range f.Replicas {
		st := r.Stats()
		hit += st.HitTokens
		query += st.QueryTokens
		gen += st.GeneratedTokens
		steps += st.Steps
	}
	t.Logf("%d replicas, %d concurrent, scale %v, flush %v: %.1fs wall, CPU %.2f cores; %d requests, %d SSE events (%.0f/s), %d tokens, %d steps, hit rate %.2f",
		replicas, conc, scale, flush, wall.Seconds(), cpu.Seconds()/wall.Seconds(),
		reqs.Load(), events.Load(), float64(events.Load())/wall.Seconds(), gen, steps, float64(hit)/float64(max(query, 1)))
}
