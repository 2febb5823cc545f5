package server_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/kvtest"
)

// lockedBuffer collects a process's output while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := listenLocal(t)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	return ln.Addr().String()
}

// buildKvroute builds the kvroute binary into a temporary directory.
func buildKvroute(t *testing.T) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to build kvroute: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "kvroute")
	out, err := exec.CommandContext(t.Context(), goBin, "build", "-o", bin, "github.com/kvroute/kvroute").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// kvroute serve, sent a real SIGTERM: /readyz is 503 at once, a new
// connection is served during timeouts.drain_delay, the listener then
// refuses connections, a stream still open after timeouts.drain ends with
// an SSE error event, the access log (JSON on stderr) has its line, the
// shutdown log counts it, and the process exits 0.
func TestServeDrainsOnSIGTERM(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildKvroute(t)
	var sent atomic.Int64
	rep := kvtest.NewReplica(t, "a", endlessStream(&sent))
	listen, admin := freeAddr(t), freeAddr(t)
	path := filepath.Join(t.TempDir(), "config.yaml")
	conf := "listen: \"" + listen + "\"\nadmin_listen: \"" + admin + "\"\npolicy: round_robin\n" +
		"log:\n  level: info\n  format: json\n" +
		"timeouts:\n  drain_delay: 2s\n  drain: 1s\n" +
		"health:\n  interval: 100ms\n" +
		"backends:\n  - name: a\n    url: \"" + rep.URL() + "\"\n"
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	var stderr lockedBuffer
	cmd := exec.CommandContext(t.Context(), bin, "serve", "--config", path)
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var exitErr error
	go func() { exitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	waitReady := time.Now().Add(20 * time.Second)
	for status(t, "http://"+admin+"/readyz") != 200 {
		if time.Now().After(waitReady) {
			t.Fatalf("kvroute never became ready; its log:\n%s", stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}

	resp, err := httpPost(t, http.DefaultClient, "http://"+listen+"/v1/chat/completions",
		strings.NewReader(`{"stream":true,"messages":[{"role":"user","content":"x"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	kvtest.WaitFor(t, time.Second, "/readyz to answer 503 after SIGTERM", func() bool { return status(t, "http://"+admin+"/readyz") == 503 })
	fresh := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	r2, err := httpPost(t, fresh, "http://"+listen+"/v1/completions", strings.NewReader(`{"model":"m1","prompt":"hi"}`))
	if err != nil {
		t.Fatalf("new connection during drain_delay: %v", err)
	}
	_ = r2.Body.Close()
	if r2.StatusCode != 200 {
		t.Fatalf("new connection during drain_delay: status %d", r2.StatusCode)
	}
	kvtest.WaitFor(t, 10*time.Second, "the listener to refuse connections after drain_delay", func() bool { return refused(t, listen) })

	rest, err := io.ReadAll(br)
	if err != nil {
		t.Fatalf("cut stream did not end cleanly: %v", err)
	}
	events := strings.Split(strings.TrimSpace(string(rest)), "\n\n")
	if last := events[len(events)-1]; !strings.Contains(last, `"code":"drain_timeout"`) {
		t.Fatalf("last event of the cut stream: %q", last)
	}
	select {
	case <-exited:
		if exitErr != nil {
			t.Fatalf("kvroute exited with %v; its log:\n%s", exitErr, stderr.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("kvroute did not exit; its log:\n%s", stderr.String())
	}

	var accessCut, shutdown int
	for _, line := range strings.Split(stderr.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) != nil {
			continue
		}
		if m["logger"] == "access" && m["path"] == "/v1/chat/completions" && strings.Contains(line, "drain_timeout") {
			accessCut++
		}
		if msg, _ := m["msg"].(string); strings.Contains(msg, "shutdown complete") {
			shutdown++
			if m["streams_cut"] != 1.0 {
				t.Errorf("shutdown log line says streams_cut=%v, want 1: %s", m["streams_cut"], line)
			}
		}
	}
	if accessCut != 1 || shutdown != 1 {
		t.Errorf("%d access-log lines for the cut stream and %d shutdown lines, want 1 each; the log:\n%s", accessCut, shutdown, stderr.String())
	}
}

// A second SIGTERM during the drain ends kvroute at once.
func TestServeSecondSignalStopsAtOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildKvroute(t)
	rep := kvtest.NewReplica(t, "a", nil)
	admin := freeAddr(t)
	path := filepath.Join(t.TempDir(), "config.yaml")
	conf := "listen: \"" + freeAddr(t) + "\"\nadmin_listen: \"" + admin + "\"\n" +
		"timeouts:\n  drain_delay: 60s\n" +
		"backends:\n  - name: a\n    url: \"" + rep.URL() + "\"\n"
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	var stderr lockedBuffer
	cmd := exec.CommandContext(t.Context(), bin, "serve", "--config", path)
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	waitReady := time.Now().Add(20 * time.Second)
	for status(t, "http://"+admin+"/healthz") != 200 {
		if time.Now().After(waitReady) {
			t.Fatalf("kvroute never came up; its log:\n%s", stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	kvtest.WaitFor(t, 5*time.Second, "/readyz to answer 503 after SIGTERM", func() bool { return status(t, "http://"+admin+"/readyz") == 503 })
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(30 * time.Second): // far less than the 60s drain_delay
		t.Fatalf("kvroute still draining after a second SIGTERM; its log:\n%s", stderr.String())
	}
}
