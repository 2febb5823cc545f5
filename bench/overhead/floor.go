package overhead

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvroute/kvroute/bench/loopback"
)

// The floor target is the least a proxy built on fasthttp does: a
// fasthttp.Server whose handler sends each request round robin with a
// fasthttp.HostClient per upstream and hands back the answer, with no
// request id, access log, metrics, timeouts, parsing or routing. Measured
// beside kvroute and nginx, it shows how much of kvroute's CPU per request
// is fasthttp's and how much is kvroute's own.

// ServeFloor serves the floor relay on ln in front of upstreams (base
// URLs, http://host:port) until ctx ends.
func ServeFloor(ctx context.Context, ln net.Listener, upstreams []string) error {
	if len(upstreams) == 0 {
		return errors.New("floor relay: no upstream")
	}
	clients := make([]*fasthttp.HostClient, 0, len(upstreams))
	for _, u := range upstreams {
		p, err := url.Parse(u)
		if err != nil || p.Scheme != "http" || p.Host == "" {
			return fmt.Errorf("floor relay: upstream %q: want http://host:port", u)
		}
		clients = append(clients, &fasthttp.HostClient{Addr: p.Host, MaxConns: 4096})
	}
	var next atomic.Uint64
	srv := &fasthttp.Server{
		Handler: func(ctx *fasthttp.RequestCtx) {
			hc := clients[next.Add(1)%uint64(len(clients))]
			ctx.Request.Header.Del("Connection")
			if err := hc.Do(&ctx.Request, &ctx.Response); err != nil {
				ctx.Error("floor relay: "+err.Error(), fasthttp.StatusBadGateway)
			}
		},
		NoDefaultServerHeader: true,
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), floorShutdown)
	defer cancel()
	err := srv.ShutdownWithContext(sctx)
	if serr := <-done; err == nil {
		err = serr
	}
	return err
}

// floorCommand is the command line serving the floor relay from this
// executable (its hidden "bench floor-relay" command).
func floorCommand(addr string, upstreams []string) ([]string, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	return []string{exe, "bench", "floor-relay", "--listen", addr, "--upstreams", strings.Join(upstreams, ",")}, nil
}

// startFloor runs the floor relay in its own process (under taskset -c
// cpus when set), files in dir.
func startFloor(ctx context.Context, dir, cpus string, upstreams []string) (*router, error) {
	addr, err := loopback.FreeAddr()
	if err != nil {
		return nil, err
	}
	argv, err := floorCommand(addr, upstreams)
	if err != nil {
		return nil, err
	}
	return startChild(ctx, TargetFloor, addr, filepath.Join(dir, "floor.log"), cpus, argv)
}

// floorShutdown bounds how long the relay waits for requests in flight
// when it stops.
const floorShutdown = 5 * time.Second
