// Command gen writes the configuration reference, the generated part of
// docs/configuration.md, from the config package's types, its Defaults and
// its field comments (and the policies' configuration types), and the
// README's table of policies from the policy registry. From the repository
// root:
//
//	go run ./config/gen
//
// (or go generate ./config). config's TestReferenceIsCurrent and
// TestReadmePolicyTableIsCurrent fail while the pages are not what this
// writes.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/kvroute/kvroute/config"
)

func main() {
	dir := flag.String("config", "config", "the config package's directory")
	out := flag.String("out", "docs/configuration.md", "the reference page, rewritten between its markers")
	readme := flag.String("readme", "README.md", "the README, whose table of policies is rewritten between its markers")
	flag.Parse()
	err := rewrite(*out, func(page []byte) ([]byte, error) { return config.Reference(*dir, page) })
	if err == nil {
		err = rewrite(*readme, config.ReadmePolicies)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "gen:", err)
		os.Exit(1)
	}
}

// rewrite replaces the file out with what gen makes of it.
func rewrite(out string, gen func([]byte) ([]byte, error)) error {
	fi, err := os.Stat(out)
	if err != nil {
		return err
	}
	page, err := os.ReadFile(out) //nolint:gosec // the page the developer names; rewriting it is the job
	if err != nil {
		return err
	}
	page, err = gen(page)
	if err != nil {
		return err
	}
	return os.WriteFile(out, page, fi.Mode().Perm()) //nolint:gosec // as above
}
