package runner

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/bench/child"
	"github.com/kvroute/kvroute/bench/loopback"
	"github.com/kvroute/kvroute/router"
)

// A Router is a load balancer under test. Start runs one instance in front
// of the given replicas and returns once it answers; each benchmark run
// starts a fresh instance.
type Router interface {
	// Name identifies the router in reports, e.g. "kvroute/cache_aware".
	Name() string
	// Start starts an instance in front of backends (base URLs,
	// http://127.0.0.1:port) that may keep its files in dir (created, empty,
	// removed by the caller after Stop). It returns when the instance
	// answers GET /v1/models, or with an error.
	Start(ctx context.Context, backends []string, dir string) (Instance, error)
}

// An Instance is a running router.
type Instance interface {
	// URL is the base URL clients send to, http://127.0.0.1:port.
	URL() string
	// Stop stops the instance and waits for it. It is safe to call twice.
	Stop() error
}

// reuseReporter is an Instance that splits the engines' prompt tokens by
// kind (kvroute_reuse_tokens_total).
type reuseReporter interface {
	ReuseTokens() map[string]int64
}

// cacheReporter is an Instance that knows how many cached tokens it
// predicted and how many the engines reported (kvroute).
type cacheReporter interface {
	CachedTokens() (predicted, reported int64)
}

// Router names. The kvroute ones are "kvroute/" + policy.
const (
	// routersAll names every router (the default).
	routersAll      = "all"
	NameNginx       = "nginx/round_robin"
	NameHAProxy     = "haproxy/leastconn"
	NameHAProxyHash = "haproxy/hdr_hash"
	// NameFlow is kvroute/cache_aware with flow control on
	// (Options.Flow); neither "all" nor "kvroute" includes it: it runs
	// when named, and in the noisy workload's default set.
	NameFlow = "kvroute/cache_aware" + flowSuffix
)

// RouterNames lists every router name, in report order, for a workload with
// or without sessions (haproxy/hdr_hash hashes the session header and is
// only meaningful with one).
func RouterNames(hasSessions bool) []string {
	names := append(slices.Clone(kvrouteNames), NameNginx, NameHAProxy)
	if hasSessions {
		names = append(names, NameHAProxyHash)
	}
	return names
}

// kvrouteNames are kvroute's routers, one per policy, in report order.
var kvrouteNames = []string{"kvroute/cache_aware", "kvroute/session", "kvroute/least_load", "kvroute/round_robin"}

// aliases maps the short names accepted in Options.Routers to full ones.
var aliases = map[string][]string{
	"cache_aware": {"kvroute/cache_aware"},
	"session":     {"kvroute/session"},
	"least_load":  {"kvroute/least_load"},
	"round_robin": {"kvroute/round_robin"},
	"kvroute":     kvrouteNames,
	"nginx":       {NameNginx},
	"haproxy":     {NameHAProxy, NameHAProxyHash},
	"leastconn":   {NameHAProxy},
	"hdr_hash":    {NameHAProxyHash},
	// Precise mode is no policy of its own: neither "all" nor "kvroute"
	// includes it.
	"cache_aware+precise": {NamePrecise},
	"cache_aware+flow":    {NameFlow},
}

// ResolveRouters turns names (full names, aliases, or "all"; empty means
// "all") into routers, in the order given, except that kvroute/cache_aware
// runs right before kvroute/cache_aware+precise (NamePrecise, which only
// its own name or cache_aware+precise selects), and is added when only the
// precise one is named. nginx and HAProxy are dropped
// with a note when their binary is missing and they were only implied (by
// "all", "haproxy" or an empty list); naming them explicitly makes a missing
// binary an error. haproxy/hdr_hash is dropped with a note from a workload
// without sessions unless named explicitly.
func ResolveRouters(names []string, hasSessions bool, nginxPath, haproxyPath string) (routers []Router, notes []string, err error) {
	type want struct {
		name     string
		explicit bool
	}
	var wants []want
	add := func(n string, explicit bool) {
		for _, w := range wants {
			if w.name == n {
				return
			}
		}
		wants = append(wants, want{n, explicit})
	}
	if len(names) == 0 {
		names = []string{routersAll}
	}
	all := RouterNames(true)
	for _, raw := range names {
		n := strings.TrimSpace(raw)
		switch {
		case n == "":
		case n == routersAll:
			for _, full := range all {
				add(full, false)
			}
		case slices.Contains(all, n) || n == NamePrecise || n == NameFlow:
			add(n, true)
		case aliases[n] != nil:
			for _, full := range aliases[n] {
				add(full, len(aliases[n]) == 1)
			}
		default:
			return nil, nil, fmt.Errorf("unknown router %q (want all, %s, %s, %s, or a short name: cache_aware, cache_aware+precise, cache_aware+flow, session, least_load, round_robin, kvroute, nginx, haproxy, leastconn, hdr_hash)",
				n, strings.Join(all, ", "), NamePrecise, NameFlow)
		}
	}
	var nginx, haproxy string
	var nginxErr, haproxyErr error
	for _, w := range wants {
		switch {
		case w.name == NamePrecise:
			routers = append(routers, &Kvroute{Policy: router.CacheAwareName, Precise: true})
		case w.name == NameFlow:
			// Its settings are Options.Flow's, set before it runs.
			routers = append(routers, &Kvroute{Policy: router.CacheAwareName, Flow: &FlowOptions{}})
		case strings.HasPrefix(w.name, "kvroute/"):
			routers = append(routers, &Kvroute{Policy: strings.TrimPrefix(w.name, "kvroute/")})
		case w.name == NameNginx:
			if nginx == "" && nginxErr == nil {
				nginx, nginxErr = FindBinary(nginxPath, "nginx")
			}
			if nginxErr != nil {
				if w.explicit {
					return nil, nil, nginxErr
				}
				notes = append(notes, fmt.Sprintf("%s skipped: %v", w.name, nginxErr))
				continue
			}
			routers = append(routers, &Nginx{Binary: nginx})
		case w.name == NameHAProxy || w.name == NameHAProxyHash:
			hash := w.name == NameHAProxyHash
			if hash && !hasSessions && !w.explicit {
				notes = append(notes, fmt.Sprintf("%s skipped: the workload has no sessions to hash", w.name))
				continue
			}
			if haproxy == "" && haproxyErr == nil {
				haproxy, haproxyErr = FindBinary(haproxyPath, "haproxy")
			}
			if haproxyErr != nil {
				if w.explicit {
					return nil, nil, haproxyErr
				}
				notes = append(notes, fmt.Sprintf("%s skipped: %v", w.name, haproxyErr))
				continue
			}
			routers = append(routers, &HAProxy{Binary: haproxy, HashSession: hash})
		}
	}
	if len(routers) == 0 {
		return nil, notes, errors.New("no router to run")
	}
	return pairPrecise(routers), notes, nil
}

// FindBinary returns path if set, else name found in PATH or in the sbin
// directories a non-root PATH often lacks.
func FindBinary(path, name string) (string, error) {
	if path != "" {
		p, err := exec.LookPath(path)
		if err != nil {
			return "", fmt.Errorf("%s: %w", name, err)
		}
		return p, nil
	}
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, dir := range []string{"/usr/sbin", "/usr/local/sbin", "/sbin"} {
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s is not installed (not in PATH, /usr/sbin or /usr/local/sbin)", name)
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago, for
// child processes that must be told their port.
func freePort() (int, error) {
	addr, err := loopback.FreeAddr()
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(addr[strings.LastIndexByte(addr, ':')+1:])
}

// waitReady polls GET base/v1/models until it answers 200, ctx ends, the
// timeout passes, or exited (when not nil) is closed.
func waitReady(ctx context.Context, base string, timeout time.Duration, exited <-chan struct{}) error {
	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}
	err := child.WaitReady(ctx, timeout, exited, func() error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/models", nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET /v1/models: %s", resp.Status)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("%s: %w", base, err)
	}
	return nil
}
