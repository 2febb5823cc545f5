package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"regexp"
	"testing"
	"time"
)

// Log lines carry their time as RFC 3339 in UTC with milliseconds.
func TestLogTimeIsRFC3339Millis(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := os.Stderr
	os.Stderr = w // zap opens "stderr" when the logger is built
	log, err := newLogger(context.Background(), "info", "json", 0)
	os.Stderr = stderr
	if err != nil {
		t.Fatal(err)
	}
	before := time.Now().Truncate(time.Millisecond)
	log.Info("hello")
	_ = log.Sync()
	_ = w.Close()
	line, err := bufio.NewReader(r).ReadBytes('\n')
	if err != nil {
		t.Fatalf("no log line: %v", err)
	}
	var entry struct {
		TS string `json:"ts"`
	}
	if err := json.Unmarshal(line, &entry); err != nil {
		t.Fatalf("log line is not JSON: %q", line)
	}
	if !regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$`).MatchString(entry.TS) {
		t.Fatalf("ts = %q, want RFC 3339 UTC with milliseconds", entry.TS)
	}
	ts, err := time.Parse(time.RFC3339Nano, entry.TS)
	if err != nil || ts.Before(before) || ts.After(time.Now()) {
		t.Errorf("ts %q does not parse as the time of logging (%v)", entry.TS, err)
	}
}
