package proxy_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/kvtest"
)

// Logs, even at debug level, carry neither prompt text nor credentials.
func TestLogsCarryNoPromptsOrCredentials(t *testing.T) {
	const prompt, cred, key = "PROMPT-SECRET-7f3a", "CRED-SECRET-91bc", "sk-inbound-key-4d2e"
	core, logs := observer.New(zapcore.DebugLevel)
	good := kvtest.NewReplica(t, "good", nil)
	bad := kvtest.NewReplica(t, "bad", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(500) })
	k := kvtest.StartLogged(t, zap.New(core, zap.AddCaller()), []*kvtest.Replica{good, bad}, func(c *config.Config) {
		c.Policy = "cache_aware"
		c.Retries = 1
		c.Log.Level = "debug"
	})
	body := fmt.Sprintf(`{"model":"m1","user":"%s","messages":[{"role":"user","content":"%s %s"}]}`, prompt, prompt, strings.Repeat("x ", 300))
	for i := 0; i < 6; i++ {
		postJSON(t, k.URL+"/v1/chat/completions", body, map[string]string{"Authorization": "Bearer " + cred, "X-Session-ID": prompt})
	}
	postJSON(t, k.URL+"/v1/chat/completions", `{"messages":[{"role":"user","content":"`+prompt, map[string]string{"Authorization": "Bearer " + cred})
	postJSON(t, k.URL+"/v1/completions", `{"prompt":5,"secret":"`+prompt+`"}`, nil)
	time.Sleep(100 * time.Millisecond)

	k2 := kvtest.StartLogged(t, zap.New(core), []*kvtest.Replica{good}, func(c *config.Config) { c.Auth.APIKeys = []string{key} })
	postJSON(t, k2.URL+"/v1/chat/completions", body, map[string]string{"Authorization": "Bearer " + key})
	postJSON(t, k2.URL+"/v1/chat/completions", body, map[string]string{"Authorization": "Bearer wrong-" + key})

	if logs.Len() == 0 {
		t.Fatal("no log entries captured")
	}
	// Access lines carry no caller, though the logger adds one to others.
	access := logs.FilterLoggerName("access").All()
	if len(access) == 0 {
		t.Fatal("no access lines")
	}
	for _, e := range access {
		if e.Caller.Defined {
			t.Errorf("access line with a caller: %s", e.Caller)
		}
	}
	for _, e := range logs.All() {
		line := e.Message
		for k, v := range e.ContextMap() {
			line += fmt.Sprintf(" %s=%v", k, v)
		}
		for _, secret := range []string{prompt, cred, key} {
			if strings.Contains(line, secret) {
				t.Errorf("log entry leaks %q: %s", secret, line)
			}
		}
	}
}
