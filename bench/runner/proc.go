package runner

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"github.com/kvroute/kvroute/bench/child"
)

// process is a router (nginx, HAProxy) running as a child process.
type process struct {
	url string
	p   *child.Process
}

// startChild starts bin with args, its output appended to logPath, and
// waits until it answers on url (see waitReady).
func startChild(ctx context.Context, url, logPath, bin string, args ...string) (*process, error) {
	p, err := child.Start(append([]string{bin}, args...), logPath, nil)
	if err != nil {
		return nil, err
	}
	if err := waitReady(ctx, url, 10*time.Second, p.Exited()); err != nil {
		_ = p.Stop(5 * time.Second)
		return nil, fmt.Errorf("%s: %w%s", bin, err, child.Tail(logPath))
	}
	return &process{url: url, p: p}, nil
}

// URL implements Instance.
func (c *process) URL() string { return c.url }

// Stop implements Instance: SIGTERM (a fast stop for both nginx and
// HAProxy), then SIGKILL after 5 s.
func (c *process) Stop() error { return c.p.Stop(5 * time.Second) }

// runCheck runs a configuration check (nginx -t, haproxy -c) and returns
// its output in the error when it fails.
func runCheck(bin string, args ...string) error {
	var out bytes.Buffer
	cmd := exec.CommandContext(context.Background(), bin, args...)
	cmd.Stdout = &out
	cmd.Stderr = &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w: %s", bin, strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}
