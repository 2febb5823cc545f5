package oracle

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/bench/load"
)

// blocksWorkload is a workload of trace-style requests, one per block-ID
// list, each prompt its blocks' full length less trim tokens.
func blocksWorkload(trim int, reqs ...[]uint64) *load.Workload {
	w := &load.Workload{Name: "blocks"}
	for _, b := range reqs {
		w.Requests = append(w.Requests, load.Request{Blocks: b, PromptTokens: len(b)*load.MooncakeBlockTokens - trim, DependsOn: -1})
	}
	return w
}

// The cap decides, and falls back to the least loaded when nobody is
// within it; without a cap the longest prefix always wins.
func TestBoundLoadCapByHand(t *testing.T) {
	w := blocksWorkload(0, []uint64{1}, []uint64{1, 2}, []uint64{1, 2, 3})
	capped := Bound(w, Options{Replicas: 2, CapacityTokens: Unbounded, LoadCap: DefaultLoadCap})
	// r0: nobody within the cap (512·2 > 1.25·512): least loaded, replica 0.
	// r1: 0 would reach 1024·2 > 1.25·1024 and 1 would reach 1024·2 > 1.25·1536:
	// least loaded, replica 1, no hit. r2: 0 (hit 512) reaches 1536·2 ≤
	// 1.25·2560, 1 (hit 1024) reaches 1536·2 > 1.25·2048: replica 0.
	if !slices.Equal(capped.Replica, []int{0, 1, 0}) || capped.HitTokens != 512 || !slices.Equal(capped.Work, []int64{1536, 1024}) {
		t.Errorf("capped: replicas %v, hits %d, work %v; want [0 1 0], 512, [1536 1024]", capped.Replica, capped.HitTokens, capped.Work)
	}
	free := Bound(w, Options{Replicas: 2, CapacityTokens: Unbounded})
	if !slices.Equal(free.Replica, []int{0, 0, 0}) || free.HitTokens != 512+1024 || free.PromptTokens != 512*6 {
		t.Errorf("no cap: replicas %v, hits %d of %d; want [0 0 0], 1536 of 3072", free.Replica, free.HitTokens, free.PromptTokens)
	}
	if got := free.WorkMaxMean(); got != 2 {
		t.Errorf("no cap: work max/mean %v, want 2 (one replica did all)", got)
	}
}

// A replica keeps a request's first blocks longest: they are touched last.
func TestBoundLRUKeepsPrefixes(t *testing.T) {
	w := blocksWorkload(0, []uint64{1, 2, 3}, []uint64{1, 2, 3}, []uint64{4}, []uint64{1, 2})
	res := Bound(w, Options{Replicas: 1, CapacityTokens: 2 * load.MooncakeBlockTokens})
	// After r0 the cache holds {1, 2} (3 evicted first); r1 hits 2 blocks;
	// r2 evicts 2 (the least recent after 3 went again); r3 hits block 1.
	if want := int64(2*512 + 512); res.HitTokens != want {
		t.Errorf("hits %d, want %d", res.HitTokens, want)
	}
	trimmed := Bound(blocksWorkload(100, []uint64{7, 8}, []uint64{7, 8}), Options{Replicas: 1, CapacityTokens: Unbounded})
	if want := int64(2*512 - 100); trimmed.HitTokens != want {
		t.Errorf("a fully cached trace prompt hits %d, want its %d prompt tokens", trimmed.HitTokens, want)
	}
}

// familyOfGenerators gives the bench/load workloads the hand cases run on.
func familyOfGenerators(t *testing.T) []*load.Workload {
	t.Helper()
	nr, err := load.NoReuse(load.NoReuseOptions{N: 20, Rate: 10, PromptTokens: 300, Seed: 2})
	if err != nil {
		t.Fatal(err)
	}
	return []*load.Workload{
		load.MultiTurn(load.MultiTurnOptions{Users: 9, SystemPrompts: 3, SystemTokens: 500, Turns: 4, Think: time.Second,
			UserTokens: 40, AnswerTokens: 30, Duration: 10 * time.Second, Seed: 5}),
		load.HotPrefix(load.HotPrefixOptions{N: 40, Rate: 5, Share: 0.4, PrefixTokens: 700, SuffixTokens: 50, Seed: 6}),
		nr,
		blocksWorkload(37, []uint64{1, 2, 3}, []uint64{1, 2, 4}, []uint64{1, 2, 4, 5}, []uint64{9}, []uint64{1, 10}, []uint64{9, 11}),
	}
}

// Ideal agrees with load.IdealHitRate; unbounded caches without a cap reach
// it on any number of replicas (the longest prefix seen anywhere is on the
// replica that served it); caches of capacity 0 hit nothing.
func TestIdealAndExtremes(t *testing.T) {
	for _, w := range familyOfGenerators(t) {
		for _, bt := range []int{16, 7} {
			ideal := Ideal(w, bt)
			if want := load.IdealHitRate(w, bt); math.Abs(ideal.HitRate()-want) > 1e-12 {
				t.Errorf("%s, block %d: ideal %.6f, load.IdealHitRate %.6f", w.Name, bt, ideal.HitRate(), want)
			}
			if ideal.HitTokens == 0 && w.Name != "noreuse(n=20)" {
				t.Errorf("%s: ideal found no hits", w.Name)
			}
			for _, n := range []int{2, 4} {
				free := Bound(w, Options{Replicas: n, BlockTokens: bt, CapacityTokens: Unbounded})
				if free.HitTokens != ideal.HitTokens || free.PromptTokens != ideal.PromptTokens {
					t.Errorf("%s, %d replicas, no cap, unbounded: %d/%d hit tokens, ideal %d/%d",
						w.Name, n, free.HitTokens, free.PromptTokens, ideal.HitTokens, ideal.PromptTokens)
				}
				none := Bound(w, Options{Replicas: n, BlockTokens: bt, CapacityTokens: 0, LoadCap: DefaultLoadCap})
				if none.HitTokens != 0 || none.PromptTokens != ideal.PromptTokens {
					t.Errorf("%s, %d replicas, capacity 0: %d/%d hit tokens, want 0/%d", w.Name, n, none.HitTokens, none.PromptTokens, ideal.PromptTokens)
				}
				var work int64
				for _, x := range none.Work {
					work += x
				}
				if work != none.PromptTokens {
					t.Errorf("%s, capacity 0: work %d, want every prompt token %d", w.Name, work, none.PromptTokens)
				}
			}
		}
	}
}

// The Text option replaces the messages as the prompt the blocks are cut from.
func TestBoundText(t *testing.T) {
	w := &load.Workload{Requests: make([]load.Request, 3)}
	texts := []string{strings.Repeat("a", 64), strings.Repeat("a", 32) + strings.Repeat("b", 40), strings.Repeat("c", 64)}
	res := Bound(w, Options{Replicas: 1, BlockTokens: 4, CapacityTokens: Unbounded,
		Text: func(i int, _ *load.Request) string { return texts[i] }})
	// Blocks of 16 bytes: the second text shares the first two; 64+72+64
	// bytes are 16+18+16 tokens.
	if res.HitTokens != 8 || res.PromptTokens != 50 {
		t.Errorf("hits %d of %d, want 8 of 50", res.HitTokens, res.PromptTokens)
	}
}

// The Tokens option replaces the prompt by an engine's token ids, cut into
// whole blocks of BlockTokens; a request without tokens is counted from its
// text. Two replicas of 4 tokens' capacity each show that keys follow the
// tokens: the second prompt's two shared blocks hit where the first went.
func TestBoundTokens(t *testing.T) {
	w := &load.Workload{Requests: make([]load.Request, 4)}
	toks := [][]uint32{{1, 2, 3, 4, 5}, {1, 2, 3, 4, 9, 9}, {1, 2, 7}, nil}
	res := Bound(w, Options{Replicas: 2, BlockTokens: 2, CapacityTokens: Unbounded,
		Tokens: func(i int, _ *load.Request) []uint32 { return toks[i] },
		Text:   func(int, *load.Request) string { return strings.Repeat("a", 32) }})
	// 0 + 4 + 2 hits of 5 + 6 + 3 tokens, then 8 text tokens that miss.
	if res.HitTokens != 6 || res.PromptTokens != 22 {
		t.Errorf("hits %d of %d, want 6 of 22", res.HitTokens, res.PromptTokens)
	}
	if res.Replica[1] != res.Replica[0] || res.Replica[2] != res.Replica[0] {
		t.Errorf("placed %v, want the sharing prompts together", res.Replica)
	}
	// One block's difference anywhere before changes every key after it.
	a, b := tokenKeys(nil, []uint32{1, 2, 3, 4}, 2), tokenKeys(nil, []uint32{1, 5, 3, 4}, 2)
	if len(a) != 2 || a[0] == b[0] || a[1] == b[1] {
		t.Errorf("keys %v and %v", a, b)
	}
}

// The blocks of an answer count as cached on the replica that generated it
// only, and not at all with PromptsOnly.
func TestBoundAnswers(t *testing.T) {
	sys := load.Message{Role: "system", Content: strings.Repeat("s", 32)}
	q0 := load.Message{Role: "user", Content: strings.Repeat("q", 20)}
	ans := load.Message{Role: "assistant", Content: strings.Repeat("a", 40)}
	q1 := load.Message{Role: "user", Content: strings.Repeat("r", 40)}
	other := load.Message{Role: "user", Content: strings.Repeat("o", 200)}
	w := &load.Workload{Requests: []load.Request{
		{Messages: []load.Message{sys, q0}, DependsOn: -1},
		{Messages: []load.Message{other}, DependsOn: -1},
		{Messages: []load.Message{sys, q0, ans, q1}, DependsOn: 1, SendsAnswer: true, AnswerOf: 0},
	}}
	// Blocks of 16 bytes: request 0 renders 43+29 = 72 bytes (4 blocks);
	// request 2's first 72+54 = 126 bytes are request 0 and its answer
	// (7 whole blocks), held by request 0's replica.
	for _, c := range []struct {
		promptsOnly bool
		hits        int64
	}{{false, 7 * 4}, {true, 4 * 4}} {
		res := Bound(w, Options{Replicas: 2, BlockTokens: 4, CapacityTokens: Unbounded, PromptsOnly: c.promptsOnly})
		if res.HitTokens != c.hits || res.Replica[0] == res.Replica[1] || res.Replica[2] != res.Replica[0] {
			t.Errorf("prompts only %v: hits %d on replicas %v, want %d, request 2 with request 0 and request 1 elsewhere", c.promptsOnly, res.HitTokens, res.Replica, c.hits)
		}
		if want := load.IdealHitRate(w, 4); !c.promptsOnly && math.Abs(Ideal(w, 4).HitRate()-want) > 1e-12 {
			t.Errorf("ideal %v, load.IdealHitRate %v", Ideal(w, 4).HitRate(), want)
		}
	}
}

// naive is a brute-force model of Bound: caches are lists of prefixes (the
// prompt's first k blocks, as a string) with a last-use stamp, scanned in
// full; placement ranks every replica explicitly.
type naive struct {
	caches [][]naiveEntry
	work   []int64
	stamp  int
}

type naiveEntry struct {
	prefix string
	tokens int64
	used   int
}

func (m *naive) run(reqs [][]string, blockTok []int64, prompts []int64, capacity int64, loadCap float64) (hit int64, replicas []int) {
	n := len(m.work)
	for q, prefixes := range reqs {
		hits := make([]int64, n)
		for k := range m.caches {
			run := 0
			for run < len(prefixes) && slices.ContainsFunc(m.caches[k], func(e naiveEntry) bool { return e.prefix == prefixes[run] }) {
				run++
			}
			hits[k] = min(int64(run)*blockTok[q], prompts[q])
		}
		var total int64
		for _, x := range m.work {
			total += x
		}
		var within []int
		for k := range n {
			newLoad := m.work[k] + prompts[q] - hits[k]
			mean := float64(total+prompts[q]-hits[k]) / float64(n)
			if loadCap <= 0 || float64(newLoad) <= loadCap*mean*(1+1e-12) {
				within = append(within, k)
			}
		}
		order := within
		less := func(a, b int) int {
			if hits[a] != hits[b] {
				return int(hits[b] - hits[a])
			}
			if m.work[a] != m.work[b] {
				return int(m.work[a] - m.work[b])
			}
			return a - b
		}
		if len(within) == 0 {
			order = make([]int, n)
			for k := range order {
				order[k] = k
			}
			less = func(a, b int) int {
				if m.work[a] != m.work[b] {
					return int(m.work[a] - m.work[b])
				}
				if hits[a] != hits[b] {
					return int(hits[b] - hits[a])
				}
				return a - b
			}
		}
		slices.SortFunc(order, less)
		best := order[0]
		replicas = append(replicas, best)
		hit += hits[best]
		m.work[best] += prompts[q] - hits[best]
		for i := len(prefixes) - 1; i >= 0; i-- {
			m.stamp++
			c := m.caches[best]
			j := slices.IndexFunc(c, func(e naiveEntry) bool { return e.prefix == prefixes[i] })
			if j < 0 {
				c = append(c, naiveEntry{prefix: prefixes[i], tokens: blockTok[q]})
				j = len(c) - 1
			}
			c[j].used = m.stamp
			m.caches[best] = c
		}
		for capacity >= 0 {
			c := m.caches[best]
			var held int64
			for _, e := range c {
				held += e.tokens
			}
			if held <= capacity || len(c) == 0 {
				break
			}
			oldest := 0
			for j := range c {
				if c[j].used < c[oldest].used {
					oldest = j
				}
			}
			m.caches[best] = slices.Delete(c, oldest, oldest+1)
		}
	}
	return hit, replicas
}

// randomWorkload builds a small workload whose prompts branch from each
// other: each extends, truncates or replaces an earlier one. Half the time
// the requests are trace-style block lists instead of text.
func randomWorkload(rng *rand.Rand, blockTokens int) (w *load.Workload, texts []string, prefixes [][]string, blockTok, prompts []int64) {
	w = &load.Workload{}
	bb := blockTokens * load.BytesPerToken
	nreq := 1 + rng.IntN(30)
	if rng.IntN(2) == 0 {
		lists := make([][]uint64, 0, nreq)
		next := uint64(1)
		for range nreq {
			var b []uint64
			if len(lists) > 0 && rng.IntN(4) > 0 {
				p := lists[rng.IntN(len(lists))]
				b = slices.Clone(p[:rng.IntN(len(p)+1)])
			}
			for range rng.IntN(4) + 1 - min(len(b), 1) {
				b = append(b, next)
				next++
			}
			lists = append(lists, b)
			prompt := len(b)*load.MooncakeBlockTokens - rng.IntN(load.MooncakeBlockTokens)
			w.Requests = append(w.Requests, load.Request{Blocks: b, PromptTokens: prompt, DependsOn: -1})
			var ps []string
			for k := 1; k <= len(b); k++ {
				ps = append(ps, fmt.Sprint(b[:k]))
			}
			prefixes = append(prefixes, ps)
			blockTok = append(blockTok, load.MooncakeBlockTokens)
			prompts = append(prompts, int64(prompt))
		}
		return w, nil, prefixes, blockTok, prompts
	}
	for range nreq {
		var s string
		if len(texts) > 0 && rng.IntN(4) > 0 {
			p := texts[rng.IntN(len(texts))]
			s = p[:rng.IntN(len(p)+1)]
		}
		for range rng.IntN(3 * bb) {
			s += string(rune('a' + rng.IntN(3)))
		}
		texts = append(texts, s)
		w.Requests = append(w.Requests, load.Request{DependsOn: -1})
		var ps []string
		for k := bb; k <= len(s); k += bb {
			ps = append(ps, s[:k])
		}
		prefixes = append(prefixes, ps)
		blockTok = append(blockTok, int64(blockTokens))
		prompts = append(prompts, int64(load.TextTokens(s)))
	}
	return w, texts, prefixes, blockTok, prompts
}

// Bound places every request where the brute-force model does, on small
// random workloads over every combination of cap and capacity.
func TestBoundMatchesBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(18, 1))
	caps := []float64{0, 1, DefaultLoadCap, 2}
	for trial := range 600 {
		bt := 1 + rng.IntN(3)
		w, texts, prefixes, blockTok, prompts := randomWorkload(rng, bt)
		n := 1 + rng.IntN(4)
		capacity := []int64{Unbounded, 0, int64(bt), int64(3 * bt), 512, 2048, int64(rng.IntN(3000))}[rng.IntN(7)]
		loadCap := caps[rng.IntN(len(caps))]
		opt := Options{Replicas: n, BlockTokens: bt, CapacityTokens: capacity, LoadCap: loadCap}
		if texts != nil {
			opt.Text = func(i int, _ *load.Request) string { return texts[i] }
		}
		got := Bound(w, opt)
		m := &naive{caches: make([][]naiveEntry, n), work: make([]int64, n)}
		hit, replicas := m.run(prefixes, blockTok, prompts, capacity, loadCap)
		if got.HitTokens != hit || !slices.Equal(got.Replica, replicas) || !slices.Equal(got.Work, m.work) {
			t.Fatalf("trial %d (%d requests, %d replicas, block %d, capacity %d, cap %v):\n bound hits %d, replicas %v, work %v\n naive hits %d, replicas %v, work %v",
				trial, len(w.Requests), n, bt, capacity, loadCap, got.HitTokens, got.Replica, got.Work, hit, replicas, m.work)
		}
		var sum int64
		for _, p := range prompts {
			sum += p
		}
		if got.PromptTokens != sum {
			t.Fatalf("trial %d: prompt tokens %d, want %d", trial, got.PromptTokens, sum)
		}
	}
}

// Replay of the bound's own placement is the bound; a placement of every
// request on one replica with an unbounded cache finds the ideal; entries
// out of range, and requests past the assignment, are placed as the bound
// would place them; a hand case counts what a placement loses.
func TestReplay(t *testing.T) {
	for _, w := range familyOfGenerators(t) {
		opt := Options{Replicas: 3, BlockTokens: 16, CapacityTokens: 2048, LoadCap: DefaultLoadCap}
		b := Bound(w, opt)
		for name, assign := range map[string][]int{
			"own":          b.Replica,
			"none":         nil,
			"out of range": slices.Repeat([]int{-1, 3}, len(w.Requests)),
		} {
			got := Replay(w, assign, opt)
			if got.HitTokens != b.HitTokens || !slices.Equal(got.Replica, b.Replica) || !slices.Equal(got.Work, b.Work) {
				t.Errorf("%s, %s: replay hits %d on %v, bound %d on %v", w.Name, name, got.HitTokens, got.Replica, b.HitTokens, b.Replica)
			}
		}
		one := Replay(w, make([]int, len(w.Requests)), Options{Replicas: 3, BlockTokens: 16, CapacityTokens: Unbounded, LoadCap: DefaultLoadCap})
		if ideal := Ideal(w, 16); one.HitTokens != ideal.HitTokens || one.Work[1] != 0 || one.Work[2] != 0 {
			t.Errorf("%s: all on replica 0 hits %d (work %v), ideal %d", w.Name, one.HitTokens, one.Work, ideal.HitTokens)
		}
	}
	// Two conversations of two turns each, split by a placement that sends
	// each second turn away from its first: no hit, where the bound finds both.
	w := blocksWorkload(0, []uint64{1, 2}, []uint64{3, 4}, []uint64{1, 2, 5}, []uint64{3, 4, 6})
	opt := Options{Replicas: 2, CapacityTokens: Unbounded, LoadCap: 2}
	if b := Bound(w, opt); b.HitTokens != 4*512 {
		t.Errorf("bound hits %d, want %d", b.HitTokens, 4*512)
	}
	split := Replay(w, []int{0, 1, 1, 0}, opt)
	if split.HitTokens != 0 || !slices.Equal(split.Work, []int64{5 * 512, 5 * 512}) {
		t.Errorf("split placement hits %d, work %v; want 0, [2560 2560]", split.HitTokens, split.Work)
	}
	kept := Replay(w, []int{0, 1, 0}, opt) // the last request placed as the bound would
	if kept.HitTokens != 4*512 || kept.Replica[3] != 1 {
		t.Errorf("kept placement hits %d, last on %d; want %d, 1", kept.HitTokens, kept.Replica[3], 4*512)
	}
}
