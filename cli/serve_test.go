package cli

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kvroute/kvroute/bench/loopback"
	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/kvtest"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	addr, err := loopback.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// post is kvtest.Post without headers: it reads and closes the answer's
// body before it returns.
//
//bodyclose:handled
func post(t *testing.T, url, body string) (*http.Response, []byte) {
	t.Helper()
	return kvtest.Post(t, url, body, nil)
}

func get(t *testing.T, url string) string {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	if err != nil {
		return ""
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return ""
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// A changed file is reloaded; an invalid one is rejected with a metric
// while the old configuration keeps serving.
func TestServeReloadsOnFileChange(t *testing.T) {
	a := kvtest.NewReplica(t, "a", nil)
	b := kvtest.NewReplica(t, "b", nil)
	listen, admin := freeAddr(t), freeAddr(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "config.yaml")
	write := func(body string) {
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil { // replaced the way editors and ConfigMaps do
			t.Fatal(err)
		}
	}
	head := "listen: \"" + listen + "\"\nadmin_listen: \"" + admin + "\"\nhealth:\n  interval: 100ms\nbackends:\n"
	write(head + "  - name: a\n    url: \"" + a.URL() + "\"\n")
	load := func() (*config.Config, error) { return config.Load(path, nil) }
	cfg, err := load()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, cfg, zap.NewNop(), path, load) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve returned %v", err)
		}
	}()
	kvtest.WaitFor(t, 10*time.Second, "admin up", func() bool { return strings.Contains(get(t, "http://"+admin+"/healthz"), "ok") })

	write(head + "  - name: a\n    url: \"" + a.URL() + "\"\n  - name: b\n    url: \"" + b.URL() + "\"\n")
	kvtest.WaitFor(t, 10*time.Second, "b added", func() bool { return strings.Contains(get(t, "http://"+admin+"/debug/backends"), `"b"`) })

	write(head + "  - name: a\n    url: \"" + a.URL() + "\"\n    bogus_key: 1\n")
	kvtest.WaitFor(t, 10*time.Second, "rejection counted", func() bool {
		return strings.Contains(get(t, "http://"+admin+"/metrics"), `kvroute_config_reloads_total{result="rejected"} 1`)
	})
	if !strings.Contains(get(t, "http://"+admin+"/debug/backends"), `"b"`) {
		t.Error("a rejected file changed the fleet")
	}
	resp, body := post(t, "http://"+listen+"/v1/chat/completions", kvtest.ChatBody)
	if resp.StatusCode != 200 {
		t.Errorf("old configuration stopped serving: %d %s", resp.StatusCode, body)
	}
}

// The watch reloads on a change of its file (not of another in its
// directory) and on an error of the watch, which may have lost a change,
// logging that; its error channel is read, so later events still arrive.
func TestConfigWatchEventsAndErrors(t *testing.T) {
	events, errs := make(chan fsnotify.Event), make(chan error)
	core, logs := observer.New(zap.WarnLevel)
	c := &configWatch{hup: make(chan os.Signal, 1), events: events, errs: errs, base: "config.yaml", log: zap.New(core)}
	reloads := make(chan string, 8)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.run(ctx, func(reason string) { reloads <- reason }) }()
	defer func() { cancel(); <-done }()
	expect := func(what string, want bool) {
		t.Helper()
		select {
		case r := <-reloads:
			if !want {
				t.Fatalf("%s: reloaded (%s)", what, r)
			}
		case <-time.After(time.Second): // five debounce periods
			if want {
				t.Fatalf("%s: no reload", what)
			}
		}
	}
	send := func(what string, ch any) {
		t.Helper()
		var ok bool
		switch v := ch.(type) {
		case fsnotify.Event:
			select {
			case events <- v:
				ok = true
			case <-time.After(5 * time.Second):
			}
		case error:
			select {
			case errs <- v:
				ok = true
			case <-time.After(5 * time.Second):
			}
		}
		if !ok {
			t.Fatalf("%s: the watch did not take it", what)
		}
	}
	send("another file written", fsnotify.Event{Name: "/etc/kvroute/other.yaml", Op: fsnotify.Write})
	expect("another file written", false)
	send("an overflow", fsnotify.ErrEventOverflow)
	expect("the watch's queue overflowed", true)
	if logs.FilterMessageSnippet("reloading in case a change was lost").Len() != 1 {
		t.Errorf("the watch's error was not logged: %v", logs.All())
	}
	send("the file replaced", fsnotify.Event{Name: "/etc/kvroute/config.yaml", Op: fsnotify.Create})
	expect("the file replaced", true)
	close(errs)
	send("a ConfigMap's data swapped", fsnotify.Event{Name: "/etc/kvroute/..data", Op: fsnotify.Create})
	expect("a ConfigMap's data swapped, the error channel closed", true)
}
