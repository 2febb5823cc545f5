package main

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// repoPath matches what reads as a path of this repository in prose: a
// directory, a slash and a Go, Markdown or YAML file name, or a bare
// upper-case Markdown name (README.md).
var repoPath = regexp.MustCompile(`\b(?:[a-z0-9_]+/)+[a-z0-9_]+\.(?:go|md|yaml)\b|\b[A-Z]+\.md\b`)

// TestNamedFilesExist: the README, docs/ and Go comments name only files
// that are in the repository. The walk, reads and checks stay inside the
// repository's root.
func TestNamedFilesExist(t *testing.T) {
	root, err := os.OpenRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = root.Close() }()
	err = fs.WalkDir(root.FS(), ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != "." && (strings.HasPrefix(name, ".") || name == "testdata" || name == "bench-out") {
				return fs.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, ".md") {
			return nil
		}
		b, err := root.ReadFile(path)
		if err != nil {
			return err
		}
		for i, line := range strings.Split(string(b), "\n") {
			if strings.HasSuffix(path, ".go") && !strings.Contains(line, "//") {
				continue // only comments name files in Go sources
			}
			if strings.Contains(line, "://") {
				continue // addresses, not files
			}
			for _, loc := range repoPath.FindAllStringIndex(line, -1) {
				m := line[loc[0]:loc[1]]
				if loc[0] > 0 && strings.ContainsRune("/.~$", rune(line[loc[0]-1])) {
					continue // an absolute or relative path elsewhere (a container's, a home's)
				}
				if exists(root, m) || exists(root, filepath.Join(filepath.Dir(path), m)) {
					continue
				}
				t.Errorf("%s:%d names %s, which is not in the repository", path, i+1, m)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func exists(root *os.Root, p string) bool {
	_, err := root.Stat(p)
	return err == nil
}
