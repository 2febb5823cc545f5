package sim

import (
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
)

// headerRank is the request header that names a data-parallel rank, as
// vLLM's API server reads it (case-insensitively).
const headerRank = "X-Data-Parallel-Rank"

// rankGroup serves the engines (ranks) of one data-parallel server behind
// one HTTP port, as vLLM's API server does with --data-parallel-size: a
// generate request goes to the rank its X-Data-Parallel-Rank header names
// (400 when it names none of them) or, without the header, to the rank
// with the fewest requests running and waiting, ties in turn; /metrics carries every
// rank's series, told apart by their engine label; /reset_prefix_cache
// resets every rank; the rest is served by rank 0 (the ranks serve one
// model with one tokenizer).
type rankGroup struct {
	ranks []*Replica
	mux   *http.ServeMux
	turn  atomic.Uint64 // rotates the first rank tried without a header
}

func newRankGroup(ranks []*Replica) *rankGroup {
	g := &rankGroup{ranks: ranks, mux: http.NewServeMux()}
	for _, path := range []string{"POST /v1/chat/completions", "POST /v1/completions"} {
		g.mux.HandleFunc(path, g.serveGenerate)
	}
	g.mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) { writeMetrics(w, g.ranks) })
	g.mux.HandleFunc("POST /reset_prefix_cache", func(w http.ResponseWriter, _ *http.Request) { serveReset(w, g.ranks) })
	g.mux.Handle("/", ranks[0].Handler())
	return g
}

func (g *rankGroup) ServeHTTP(w http.ResponseWriter, r *http.Request) { g.mux.ServeHTTP(w, r) }

func (g *rankGroup) serveGenerate(w http.ResponseWriter, r *http.Request) {
	rank := 0
	if v := r.Header.Get(headerRank); v != "" {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || n < 0 || n >= len(g.ranks) {
			writeError(w, http.StatusBadRequest, "invalid_data_parallel_rank",
				"X-Data-Parallel-Rank "+strconv.Quote(v)+" is not a rank of 0.."+strconv.Itoa(len(g.ranks)-1))
			return
		}
		rank = n
	} else {
		// The least busy, ties taken in turn.
		n, start, best := len(g.ranks), int(g.turn.Add(1)), -1
		for k := range n {
			i := (start + k) % n
			if q := g.ranks[i].queued(); best < 0 || q < best {
				rank, best = i, q
			}
		}
	}
	g.ranks[rank].Handler().ServeHTTP(w, r)
}

// queued is the number of requests running and waiting.
func (r *Replica) queued() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.running) + len(r.waiting)
}
