// Command gen writes the configuration reference, the generated part of
// docs/configuration.md, from the config package's types, its Defaults and
// its field comments. From the repository root:
//
//	go run ./config/gen
//
// (or go generate ./config). config's TestReferenceIsCurrent fails while
// the page is not what this writes.
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
	flag.Parse()
	if err := run(*dir, *out); err != nil {
		fmt.Fprintln(os.Stderr, "gen:", err)
		os.Exit(1)
	}
}

func run(dir, out string) error {
	fi, err := os.Stat(out)
	if err != nil {
		return err
	}
	page, err := os.ReadFile(out) //nolint:gosec // the page the developer names; rewriting it is the job
	if err != nil {
		return err
	}
	page, err = config.Reference(dir, page)
	if err != nil {
		return err
	}
	return os.WriteFile(out, page, fi.Mode().Perm()) //nolint:gosec // as above
}
