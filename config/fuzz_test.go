package config

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzLoad feeds arbitrary bytes as config.yaml: Load must answer with a
// configuration that validates or an error, never panic.
func FuzzLoad(f *testing.F) {
	if b, err := os.ReadFile("../config.yaml"); err == nil {
		f.Add(b)
	}
	f.Add([]byte(minimal))
	f.Add([]byte("backends: [{name: a, url: 'http://127.0.0.1:1', models: [x, y]}]\nretries: 2\n"))
	f.Add([]byte("timeouts: {connect: -1s}\n"))
	f.Add([]byte("{{{"))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		p := filepath.Join(dir, "c.yaml")
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := Load(p, nil)
		if err != nil {
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("Load returned an invalid configuration: %v", err)
		}
	})
}
