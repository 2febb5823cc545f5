package server_test

import (
	"bufio"
	"bytes"
	"encoding/json"
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

	"github.com/kvroute/kvroute/bench/loopback"
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
	addr, err := loopback.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
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
	p := startServe(t, bin, admin, "/readyz", "listen: \""+listen+"\"\nadmin_listen: \""+admin+"\"\npolicy: round_robin\n"+
		"log:\n  level: info\n  format: json\n"+
		"timeouts:\n  drain_delay: 2s\n  drain: 1s\n"+
		"health:\n  interval: 100ms\n"+
		"backends:\n  - name: a\n    url: \""+rep.URL()+"\"\n")
	cmd, stderr, exited := p.cmd, &p.log, p.exited

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
	drainsThenCuts(t, listen, br)
	select {
	case <-exited:
		if exitErr := p.err; exitErr != nil {
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
	p := startServe(t, bin, admin, "/healthz", "listen: \""+freeAddr(t)+"\"\nadmin_listen: \""+admin+"\"\n"+
		"timeouts:\n  drain_delay: 60s\n"+
		"backends:\n  - name: a\n    url: \""+rep.URL()+"\"\n")
	cmd, stderr, exited := p.cmd, &p.log, p.exited
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	kvtest.WaitFor(t, 5*time.Second, "/readyz to answer 503 after SIGTERM", func() bool { return status(t, "http://"+admin+"/readyz") == 503 })
	// The drain may not listen for the next signal yet when /readyz first
	// answers 503: send it again until kvroute exits.
	deadline := time.After(30 * time.Second) // far less than the 60s drain_delay
	for {
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			select {
			case <-exited:
				return
			case <-time.After(5 * time.Second):
				t.Fatal(err)
			}
		}
		select {
		case <-exited:
			return
		case <-time.After(time.Second):
		case <-deadline:
			t.Fatalf("kvroute still draining after a second SIGTERM; its log:\n%s", stderr.String())
		}
	}
}

// serveProcess is a `kvroute serve` process of the test.
type serveProcess struct {
	cmd    *exec.Cmd
	log    lockedBuffer  // its stdout and stderr
	exited chan struct{} // closed once it exited
	err    error         // its exit error, once exited is closed
}

// startServe runs bin serve with the configuration conf, killed when the
// test ends, and waits until GET ready on the admin address answers 200.
func startServe(t *testing.T, bin, admin, ready, conf string) *serveProcess {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	p := &serveProcess{exited: make(chan struct{})}
	p.cmd = exec.CommandContext(t.Context(), bin, "serve", "--config", path)
	p.cmd.Stdout, p.cmd.Stderr = &p.log, &p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.exited
	})
	deadline := time.Now().Add(20 * time.Second)
	for status(t, "http://"+admin+ready) != 200 {
		if time.Now().After(deadline) {
			t.Fatalf("kvroute never answered %s; its log:\n%s", ready, p.log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	return p
}
