package main

import (
	"bytes"
	"errors"
	"io"
	"os"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/kvroute/kvroute/config"
)

// The Kubernetes manifests' kvroute configuration loads and validates as
// the pods would run it (the route token from its Secret), and runs the
// cluster.
func TestKubernetesConfigLoads(t *testing.T) {
	raw, err := os.ReadFile("deploy/kubernetes/kvroute.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	found := false
	for {
		var doc struct {
			Kind string            `yaml:"kind"`
			Data map[string]string `yaml:"data"`
		}
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		if doc.Kind != "ConfigMap" {
			continue
		}
		for name, body := range doc.Data {
			found = true
			cfg, err := config.LoadBytes(name, []byte(body), []string{"KVROUTE_CLUSTER_TOKEN=test-token-0123"}, nil)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if len(cfg.Deprecated) > 0 {
				t.Errorf("%s sets deprecated keys: %q", name, cfg.Deprecated)
			}
			if !cfg.Cluster.Enabled || cfg.Cluster.Discover == "" || cfg.Cluster.Token == "" {
				t.Errorf("%s: cluster %+v, want it on, discovered, with the token", name, cfg.Cluster)
			}
		}
	}
	if !found {
		t.Fatal("no ConfigMap in deploy/kubernetes/kvroute.yaml")
	}
}
