package kvtest

import (
	"os"
	"path/filepath"
)

// Trace returns the path of a public trace for the tests that replay it:
// the file named by the environment variable env, else the copy under
// workloads/<rel> in a "shared" directory beside the checkout, where the
// project's CI keeps the traces. "" when neither exists: such tests skip.
func Trace(env, rel string) string {
	if p := os.Getenv(env); p != "" {
		return p
	}
	dir, err := os.Getwd()
	if err != nil {
		return ""
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			p := filepath.Join(dir, "..", "shared", "workloads", rel)
			if _, err := os.Stat(p); err == nil {
				return p
			}
			return ""
		}
		up := filepath.Dir(dir)
		if up == dir {
			return ""
		}
		dir = up
	}
}
