package server

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/kvroute/kvroute/cluster"
	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/telemetry"
)

// buildCluster makes the server a member of its cluster when
// cluster.enabled is set: the router's decisions are shared from Run on.
func (s *Server) buildCluster(cfg *config.Config) error {
	if !cfg.Cluster.Enabled {
		return nil
	}
	rt := s.Router
	node, err := cluster.New(cluster.Options{
		Config: cfg.Cluster, Fleet: s.Fleet, Router: rt, Log: s.log.Named("cluster"),
		Horizon:            rt.Index().TTL,
		DiscoveryInterval:  cfg.Discovery.Interval,
		MaxConnsPerReplica: cfg.Limits.MaxConnsPerReplica,
	})
	if err != nil {
		return err
	}
	s.cluster = node
	s.Metrics.AddCluster(node.Stats)
	s.Metrics.AddClusterLag(func() telemetry.LagHistogram {
		l := node.PlacementLag()
		return telemetry.LagHistogram{Bounds: cluster.LagBounds[:], Buckets: l.Buckets, Count: l.Count, Sum: l.Sum}
	})
	return nil
}

// startCluster starts the cluster member, if any, for as long as ctx lasts.
func (s *Server) startCluster(ctx context.Context) error {
	if s.cluster == nil {
		return nil
	}
	return s.cluster.Start(ctx)
}

// stopCluster waits, after the context given to startCluster ended, for the
// member to publish what it gathered and close (bounded: NATS may hang).
func (s *Server) stopCluster() {
	if s.cluster == nil {
		return
	}
	select {
	case <-s.cluster.Done():
	case <-time.After(5 * time.Second):
		s.log.Warn("cluster: did not stop within 5s")
	}
}

// ClusterAddr is the embedded NATS server's route address (host:port) once
// Run started it; "" when the cluster is off or uses cluster.nats_url.
func (s *Server) ClusterAddr() string {
	if s.cluster == nil {
		return ""
	}
	return s.cluster.ClusterAddr()
}

// ClusterStats returns the cluster member's counters (zero when the
// cluster is off).
func (s *Server) ClusterStats() cluster.Stats {
	if s.cluster == nil {
		return cluster.Stats{}
	}
	return s.cluster.Stats()
}

// ClusterLeadWait returns how long this instance waited for its cluster
// leader's answers (zero when the cluster is off).
func (s *Server) ClusterLeadWait() cluster.Lag {
	if s.cluster == nil {
		return cluster.Lag{}
	}
	return s.cluster.LeadWait()
}

// ClusterLag returns how long peers' placements took to reach this
// instance's index (zero when the cluster is off).
func (s *Server) ClusterLag() cluster.Lag {
	if s.cluster == nil {
		return cluster.Lag{}
	}
	return s.cluster.PlacementLag()
}

// clusterLog names the cluster member in the serving log line.
func (s *Server) clusterLog() zap.Field {
	if s.cluster == nil {
		return zap.Skip()
	}
	return zap.String("cluster_id", s.cluster.ID())
}

// lonelyRepeat is how often the warning of an instance that hears no
// peer is repeated while that lasts.
const lonelyRepeat = time.Minute

// watchPeers keeps the proxy's tenant limits at this instance's share:
// the limits divided by the instances of the cluster alive (itself and
// the peers it hears), checked every second until ctx is done. An
// instance configured to have peers (cluster.peers, cluster.discover or
// cluster.nats_url) that hears none for longer than a health interval
// says so loudly, at once and every lonelyRepeat while it lasts, rather
// than route alone in silence.
func (s *Server) watchPeers(ctx context.Context) {
	if s.cluster == nil {
		return
	}
	t := time.NewTicker(time.Second)
	defer t.Stop()
	var alone, warned time.Time // since when no peer is heard; the last warning
	for {
		peers := s.cluster.Stats().Peers
		s.Proxy.SetFlowShare(1 + peers)
		cfg := s.Config()
		c := &cfg.Cluster
		expects := len(c.Peers) > 0 || c.Discover != "" || c.NATSURL != ""
		now := time.Now()
		switch {
		case peers > 0 || !expects:
			if !warned.IsZero() {
				s.log.Info("cluster: peers heard again", zap.Int("peers", peers))
			}
			alone, warned = time.Time{}, time.Time{}
		case alone.IsZero():
			alone = now
		case now.Sub(alone) > cfg.Health.Interval && now.Sub(warned) >= lonelyRepeat:
			warned = now
			s.log.Warn("cluster: no peer heard: this instance routes on its own view alone, its placements shared with no one "+
				"(check cluster.peers or cluster.discover, that the route port is reachable, and that every instance has the same cluster.token)",
				zap.Duration("alone_for", now.Sub(alone).Round(time.Second)))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
