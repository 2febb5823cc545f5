package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"math/rand/v2"
	"os"
	"regexp"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"
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

// rfc3339Millis, which keeps the text of the last millisecond, writes
// what formatting each time afresh writes: times in and out of order,
// in one millisecond and across them, in any zone.
func TestLogTimeMatchesTheLayout(t *testing.T) {
	enc := zapcore.NewJSONEncoder(zapcore.EncoderConfig{TimeKey: "ts", EncodeTime: rfc3339Millis})
	zone := time.FixedZone("X", -7*3600)
	base := time.Date(2026, 12, 31, 23, 59, 59, 998_000_000, time.UTC)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 2000 {
		t0 := base.Add(time.Duration(rng.IntN(5_000_000)) * time.Microsecond)
		if i%3 == 0 {
			t0 = t0.In(zone)
		}
		buf, err := enc.EncodeEntry(zapcore.Entry{Time: t0}, nil)
		if err != nil {
			t.Fatal(err)
		}
		want := `{"ts":"` + t0.UTC().Format(millisLayout) + `"}` + "\n"
		if got := buf.String(); got != want {
			t.Fatalf("%v: %q, want %q", t0, got, want)
		}
		buf.Free()
	}
}
