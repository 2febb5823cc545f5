package config

import (
	"fmt"
	"net"
	"slices"
	"testing"
	"time"
)

// The cluster section: off by default; when on, read from the file and the
// environment and validated key by key.
func TestCluster(t *testing.T) {
	bare := minimal + "cluster:\n  enabled: true\n"
	on := bare + "  token: s3cret\n"
	tlsOn := bare + "  tls: {cert_file: c.pem, key_file: k.pem, ca_file: ca.pem}\n"
	cases := []struct {
		name, body string
		env        []string
		want       func(Cluster) bool
		err        string
	}{
		{name: "default", body: minimal, want: func(c Cluster) bool {
			return !c.Enabled && c.Name == "kvroute" && c.Listen == "" && c.BatchInterval == time.Millisecond &&
				c.LoadInterval == 250*time.Millisecond && c.JournalBytes == 64<<20 && c.LeadTimeout == 10*time.Millisecond &&
				c.MaxPeers == 16 && c.MaxPeerPlacementBytes == 8<<20
		}},
		{name: "peers", body: on + "  peers: [\"10.0.0.2:6222\", \"kv-1.kv:6222\"]\n", want: func(c Cluster) bool {
			return c.Enabled && slices.Equal(c.Peers, []string{"10.0.0.2:6222", "kv-1.kv:6222"}) && c.Token == "s3cret"
		}},
		{name: "environment", body: bare, env: []string{"KVROUTE_CLUSTER_DISCOVER=kvroute-cluster.default.svc:6222", "KVROUTE_CLUSTER_TOKEN=t0k"},
			want: func(c Cluster) bool { return c.Discover == "kvroute-cluster.default.svc:6222" && c.Token == "t0k" }},
		{name: "nats url", body: on + "  nats_url: nats://a:4222,tls://b:4222\n", want: func(c Cluster) bool { return c.NATSURL != "" }},
		{name: "bad name", body: on + "  name: \"a.b\"\n", err: "cluster.name: must be letters"},
		{name: "bad id", body: on + "  id: \"x y\"\n", err: "cluster.id: must be letters"},
		{name: "bad peer", body: on + "  peers: [\"nohost\"]\n", err: "cluster.peers[0]"},
		{name: "bad port", body: on + "  peers: [\"h:99999\"]\n", err: "cluster.peers[0]"},
		{name: "bad discover", body: on + "  discover: \"svc\"\n", err: "cluster.discover"},
		{name: "bad nats url", body: on + "  nats_url: http://x:4222\n", err: "cluster.nats_url: server 1"},
		{name: "half tls", body: on + "  tls: {cert_file: c.pem}\n", err: "cluster.tls: cert_file, key_file and ca_file go together"},
		{name: "tls without ca", body: bare + "  tls: {cert_file: c.pem, key_file: k.pem}\n", err: "cluster.tls: cert_file, key_file and ca_file go together"},
		{name: "no credentials", body: bare, err: "cluster.token: the cluster admits members only"},
		{name: "nats url without credentials", body: bare + "  nats_url: nats://a:4222\n", err: "cluster.token: is required with cluster.nats_url"},
		{name: "nats url with tls alone", body: tlsOn + "  nats_url: tls://a:4222\n", err: "cluster.token: is required with cluster.nats_url"},
		{name: "mutual tls", body: tlsOn, want: func(c Cluster) bool { return c.Token == "" && c.TLS.CAFile == "ca.pem" }},
		{name: "zero max peers", body: on + "  max_peers: 0\n", err: "cluster.max_peers: must be positive"},
		{name: "zero placement bytes", body: on + "  max_peer_placement_bytes: 0\n", err: "cluster.max_peer_placement_bytes: must be positive"},
		{name: "zero batch", body: on + "  batch_interval: 0s\n", err: "cluster.batch_interval: must be a positive duration"},
		{name: "no leader", body: on + "  lead_timeout: 0s\n", want: func(c Cluster) bool { return c.LeadTimeout == 0 }},
		{name: "negative lead timeout", body: on + "  lead_timeout: -1ms\n", err: "cluster.lead_timeout: must not be negative"},
		{name: "zero journal", body: on + "  journal_bytes: 0\n", err: "cluster.journal_bytes: must be positive"},
		{name: "off ignores", body: minimal + "cluster:\n  name: \"a.b\"\n", want: func(c Cluster) bool { return !c.Enabled }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := loadCase(t, c.body, c.env, c.err)
			if cfg == nil {
				return
			}
			if !c.want(cfg.Cluster) {
				t.Errorf("cluster %+v", cfg.Cluster)
			}
		})
	}
}

// The precise section and backends' kv_events.
func TestPrecise(t *testing.T) {
	withEvents := "backends:\n  - name: a\n    url: http://127.0.0.1:8001\n    kv_events: {endpoint: %s}\n"
	withListen := "backends:\n  - name: a\n    url: http://127.0.0.1:8001\n    kv_events: {listen: %s, allow_from: %s}\n"
	ranks := "backends:\n  - name: a\n    url: http://127.0.0.1:8001\n    data_parallel_size: 8\n    kv_events:\n"
	cases := []struct {
		name, body string
		err        string
	}{
		{name: "default", body: minimal},
		{name: "on", body: minimal + "precise: {render_url: \"http://127.0.0.1:8001\"}\n"},
		{name: "events", body: fmt.Sprintf(withEvents, `"tcp://*:5557"`)},
		{name: "events host", body: fmt.Sprintf(withEvents, `"tcp://10.0.0.1:5557"`)},
		{name: "bad render url", body: minimal + "precise: {render_url: \"ftp://x\"}\n", err: "precise.render_url"},
		{name: "zero timeout", body: minimal + "precise: {render_timeout: 0s}\n", err: "precise.render_timeout: must be a positive duration"},
		{name: "silence check off", body: minimal + "precise: {max_event_silence: 0s}\n"},
		{name: "negative silence", body: minimal + "precise: {max_event_silence: -1s}\n", err: "precise.max_event_silence: must not be negative"},
		{name: "bad endpoint", body: fmt.Sprintf(withEvents, `"http://x:1"`), err: "backends[0].kv_events.endpoint"},
		{name: "no port", body: fmt.Sprintf(withEvents, `"tcp://x"`), err: "backends[0].kv_events.endpoint"},
		{name: "listen", body: fmt.Sprintf(withListen, `"tcp://*:5557"`, `["10.0.0.0/8", "10.1.2.3", "fd00::/8"]`)},
		{name: "listen and endpoint", body: fmt.Sprintf(withEvents, `"tcp://*:5557", listen: "tcp://*:5557"`),
			err: "backends[0].kv_events.listen: set either endpoint (kvroute dials the engine) or listen (the engine dials kvroute), not both"},
		{name: "bad listen", body: fmt.Sprintf(withListen, `"udp://*:5557"`, `[]`), err: "backends[0].kv_events.listen"},
		{name: "bad allow_from", body: fmt.Sprintf(withListen, `"tcp://*:5557"`, `["10.0.0.0/33"]`),
			err: "backends[0].kv_events.allow_from[0]: \"10.0.0.0/33\" is neither an IP address nor a CIDR prefix"},
		{name: "allow_from without listen", body: fmt.Sprintf(withEvents, `"tcp://*:5557", allow_from: ["10.0.0.1"]`),
			err: "backends[0].kv_events.allow_from: applies only with listen"},
		{name: "listen ranks past the last port", body: ranks + "      listen: \"tcp://*:65530\"\n", err: "backends[0].kv_events.listen"},
		{name: "ranks", body: ranks + "      endpoint: \"tcp://*:5557\"\n      replay_endpoint: \"tcp://*:5600\"\n"},
		{name: "ranks past the last port", body: ranks + "      endpoint: \"tcp://*:65530\"\n",
			err: "backends[0].kv_events.endpoint: \"tcp://*:65530\": rank 7's port 65537"},
		{name: "replay ranks past the last port", body: ranks + "      endpoint: \"tcp://*:5557\"\n      replay_endpoint: \"tcp://*:65535\"\n",
			err: "backends[0].kv_events.replay_endpoint"},
		{name: "zero ranks", body: minimal + "    data_parallel_size: 0\n"},
		{name: "negative ranks", body: minimal + "    data_parallel_size: -1\n", err: "backends[0].data_parallel_size: must be 1..1024 (0 means 1), got -1"},
		{name: "too many ranks", body: minimal + "    data_parallel_size: 2000\n", err: "backends[0].data_parallel_size: must be 1..1024"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := loadCase(t, c.body, nil, c.err)
			if cfg != nil && (c.name == "default" || c.name == "zero ranks") && (cfg.Precise.Enabled() || cfg.Precise.RenderTimeout != 20*time.Millisecond ||
				cfg.Backends[0].DataParallelSize != 1) {
				t.Errorf("precise %+v, data_parallel_size %d", cfg.Precise, cfg.Backends[0].DataParallelSize)
			}
		})
	}
}

// cluster.listen's default is this host's own address, never a wildcard;
// a listen that is set is kept.
func TestClusterListen(t *testing.T) {
	if got := ClusterListen("0.0.0.0:7000"); got != "0.0.0.0:7000" {
		t.Errorf("set listen became %q", got)
	}
	got := ClusterListen("")
	host, port, err := net.SplitHostPort(got)
	if err != nil || port != DefaultClusterPort {
		t.Fatalf("default listen %q: %v", got, err)
	}
	ip := net.ParseIP(host)
	if ip == nil || ip.IsUnspecified() {
		t.Errorf("default listen %q: want this host's own address", got)
	}
}
