package runner

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/bench/load"
)

// RunURL ignores the simulator's time scale: against a real endpoint the
// arrivals go out at the workload's own pace and the times are measured.
func TestRunURLIgnoresTimeScale(t *testing.T) {
	const delay = 200 * time.Millisecond
	var lc net.ListenConfig
	ln, err := lc.Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		time.Sleep(delay)
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\" a\"}}]}\n\ndata: [DONE]\n\n")
	})}
	go func() { _ = srv.Serve(ln) }()
	defer func() { _ = srv.Close() }()
	url := "http://" + ln.Addr().String()

	o := DefaultOptions()
	o.TimeScale = 0.1 // the simulator's; RunURL must not apply it
	o.Workload = "hotprefix"
	o.HotPrefix = load.HotPrefixOptions{N: 3, Rate: 1000, Share: 0.5, PrefixTokens: 32, SuffixTokens: 8, MaxTokens: 1, Seed: 1}
	o.Out = filepath.Join(t.TempDir(), "out")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rep, err := RunURL(ctx, url, o)
	if err != nil {
		t.Fatal(err)
	}
	if rep.TimeScale != 1 || rep.Target != url || len(rep.Results) != 1 {
		t.Fatalf("time scale %v, target %q, %d results", rep.TimeScale, rep.Target, len(rep.Results))
	}
	s := rep.Results[0].Summary
	if s.OK != 3 {
		t.Fatalf("%d/%d ok", s.OK, s.Requests)
	}
	if s.TTFT.P50 < delay.Seconds() || s.TTFT.P50 >= 10*delay.Seconds() {
		t.Errorf("TTFT p50 %.3fs: want the measured time, at least %v and not scaled up tenfold", s.TTFT.P50, delay)
	}
	for _, name := range []string{FileMarkdown, FileJSON, FileSVG} {
		if _, err := os.Stat(filepath.Join(o.Out, name)); err != nil {
			t.Errorf("no %s in Out: %v", name, err)
		}
	}
	md := rep.Markdown()
	for _, want := range []string{"against " + url, "in real time", "| target |", "| " + url + " | 3/3 | 0 | – |"} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	checkSVG(t, []byte(rep.SVG()), 1)

	if _, err := RunURL(ctx, "127.0.0.1:1", o); err == nil || !strings.Contains(err.Error(), "http://") {
		t.Errorf("a URL without a scheme: got %v", err)
	}
}
