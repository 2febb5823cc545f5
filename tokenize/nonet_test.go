package tokenize

import (
	"errors"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"

	tiktoken "github.com/pkoukk/tiktoken-go"
)

// blockedTransport fails every request and counts them.
type blockedTransport struct{ calls atomic.Int64 }

func (b *blockedTransport) RoundTrip(*http.Request) (*http.Response, error) {
	b.calls.Add(1)
	return nil, errors.New("network use in a test")
}

const noNetEnv = "KVTEST_TOKENIZE_NONET_CHILD"

// TestNoNetwork loads both encodings, in this package and in tiktoken-go, in
// a fresh process where HTTP is blocked and tiktoken-go's download cache is
// empty, and checks that nothing was fetched.
func TestNoNetwork(t *testing.T) {
	if os.Getenv(noNetEnv) != "" {
		noNetworkChild(t)
		return
	}
	cacheDir := t.TempDir()
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestNoNetwork$", "-test.v")
	cmd.Env = append(os.Environ(), noNetEnv+"=1", "TIKTOKEN_CACHE_DIR="+cacheDir,
		"HTTP_PROXY=http://127.0.0.1:9", "HTTPS_PROXY=http://127.0.0.1:9", "NO_PROXY=")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "no network: ok") {
		t.Fatalf("child: %v\n%s", err, out)
	}
	if ents, _ := os.ReadDir(cacheDir); len(ents) != 0 {
		t.Fatalf("tiktoken-go cached downloads: %v", ents)
	}
}

func noNetworkChild(t *testing.T) {
	blocked := &blockedTransport{}
	http.DefaultTransport = blocked

	// The guard works: tiktoken-go's own loader would download.
	if _, err := tiktoken.NewDefaultBpeLoader().LoadTiktokenBpe(bpeFileURL[EncodingCL100K]); err == nil || blocked.calls.Load() != 1 {
		t.Fatalf("default loader: err %v, %d calls; the guard does not see downloads", err, blocked.calls.Load())
	}
	blocked.calls.Store(0)

	for _, name := range encodings {
		tk, err := New(Options{Encoding: name})
		if err != nil {
			t.Fatal(err)
		}
		if len(tk.Encode(nil, "hello world")) != 2 {
			t.Fatalf("%s: unexpected tokens", name)
		}
		// The reference sets the offline loader before fetching an encoding.
		if got := referenceTokens(t, name, "hello world"); len(got) != 2 {
			t.Fatalf("%s reference: unexpected tokens %v", name, got)
		}
	}
	if n := blocked.calls.Load(); n != 0 {
		t.Fatalf("%d network requests", n)
	}
	t.Log("no network: ok")
}
