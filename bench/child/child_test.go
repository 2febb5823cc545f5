package child

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestStartStopAndTail(t *testing.T) {
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh")
	}
	tests := []struct {
		name     string
		script   string
		wantStop string // "" or a substring of Stop's error
	}{
		{"stops on SIGTERM", "echo started; exec sleep 30", ""},
		{"killed when it ignores SIGTERM", "trap '' TERM; echo started; while :; do sleep 0.05; done", "killed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			log := filepath.Join(t.TempDir(), "out.log")
			p, err := Start([]string{"sh", "-c", tc.script}, log, nil)
			if err != nil {
				t.Fatal(err)
			}
			// Ready once the script has written its line.
			err = WaitReady(context.Background(), 5*time.Second, p.Exited(), func() error {
				if !strings.Contains(Tail(log), "started") {
					return errors.New("no output yet")
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			err = p.Stop(300 * time.Millisecond)
			if tc.wantStop == "" && err != nil || tc.wantStop != "" && (err == nil || !strings.Contains(err.Error(), tc.wantStop)) {
				t.Fatalf("Stop() = %v, want %q", err, tc.wantStop)
			}
			select {
			case <-p.Exited():
			default:
				t.Fatal("Stop returned before the process exited")
			}
			if again := p.Stop(time.Second); again != err { //nolint:errorlint // the very same value: the first result, as it was
				t.Fatalf("second Stop() = %v, first %v", again, err)
			}
			if got := Tail(log); got != ": started" {
				t.Fatalf("Tail = %q", got)
			}
		})
	}
}

func TestWaitReadyReportsExitAndTimeout(t *testing.T) {
	exited := make(chan struct{})
	close(exited)
	probe := func() error { return errors.New("refused") }
	err := WaitReady(context.Background(), time.Minute, exited, probe)
	if err == nil || !strings.Contains(err.Error(), "exited before it was ready") || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("exited child: %v", err)
	}
	err = WaitReady(context.Background(), 50*time.Millisecond, nil, probe)
	if err == nil || !strings.Contains(err.Error(), "not ready after") {
		t.Fatalf("timeout: %v", err)
	}
	if got := Tail(filepath.Join(t.TempDir(), "missing")); got != "" {
		t.Fatalf("Tail of a missing file = %q", got)
	}
	empty := filepath.Join(t.TempDir(), "empty")
	if err := os.WriteFile(empty, []byte(" \n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := Tail(empty); got != "" {
		t.Fatalf("Tail of a blank file = %q", got)
	}
}
