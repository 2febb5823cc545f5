package server

import (
	"context"
	"errors"
	"net"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"
)

// cutGrace is how long, after timeouts.drain ran out, cut streams get to
// send their last event and close.
const cutGrace = 2 * time.Second

// drain stops the proxy the way Kubernetes expects: /readyz answers 503 at
// once; new connections are still accepted for timeouts.drain_delay (when
// delay is true), the time endpoints and load balancers take to stop
// sending; then the listener closes and requests in flight have
// timeouts.drain to finish. Streams still open then are cut (an SSE error
// event and an access-log line each) and the last log line says how many.
func (s *Server) drain(fs *fasthttp.Server, delay bool) {
	s.draining.Store(true)
	t := s.cfg.Load().Timeouts
	if delay && t.DrainDelay > 0 {
		s.log.Info("draining: /readyz answers 503; new connections are accepted for timeouts.drain_delay",
			zap.Duration("drain_delay", t.DrainDelay))
		time.Sleep(t.DrainDelay)
	}
	s.log.Info("shutting down: no new connections; requests in flight have timeouts.drain",
		zap.Duration("drain", t.Drain), zap.Int64("in_flight", s.Proxy.InFlight()))
	// The shutdown runs until every connection closed or stop is cancelled:
	// while it runs, each response ends its connection, cut streams' too.
	stop, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- fs.ShutdownWithContext(stop) }()
	timer := time.NewTimer(t.Drain)
	defer timer.Stop()
	select {
	case err := <-done:
		s.shutdownError(err)
		s.log.Info("shutdown complete: every request in flight finished", zap.Int("streams_cut", 0))
		return
	case <-timer.C:
	}
	cctx, ccancel := context.WithTimeout(context.Background(), cutGrace)
	defer ccancel()
	cut := s.Proxy.CutStreams(cctx)
	var err error
	select {
	case err = <-done:
	case <-cctx.Done():
		cancel()
		err = <-done
	}
	s.shutdownError(err)
	s.log.Warn("shutdown complete: timeouts.drain ran out; streams still open were cut",
		zap.Duration("drain", t.Drain), zap.Int("streams_cut", cut), zap.Int64("requests_abandoned", s.Proxy.InFlight()))
}

// shutdownError logs what the proxy server's shutdown returned, unless it
// is what drain expects: nothing, the cancellation drain made itself once
// cut streams had their grace, or a listener closed already (serving on it
// failed, which is why drain runs).
func (s *Server) shutdownError(err error) {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, net.ErrClosed) {
		return
	}
	s.log.Warn("shutdown: closing the proxy listener failed", zap.Error(err))
}
