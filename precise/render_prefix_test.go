package precise

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/bench/sim"
	"github.com/kvroute/kvroute/internal/wait"
	"github.com/kvroute/kvroute/oai"
)

// TestRenderPrefix: once PrefixAfter next turns in a row rendered with
// their previous turn as a prefix, a next turn is answered at once with
// its previous turn's tokens but the last (a prefix of its own render, as
// the sim renders it), and rendered in the background for the turn after.
func TestRenderPrefix(t *testing.T) {
	r := newTestRenderer(t, RenderOptions{URL: renderSim(t), Timeout: 5 * time.Second, PrefixAfter: 2})
	ctx := context.Background()
	msgs := []sim.Message{{Role: "system", Content: renderText("sys", 40)}, {Role: "user", Content: "q0"}}
	var prevToks []uint32
	for turn := range 6 {
		msgs = nextTurn(msgs, turn)
		want := sim.TokenIDs(sim.RenderChat(msgs))
		toks, whole, err := r.RenderPrefix(ctx, oai.KindChat, renderChatBody(t, msgs, nil), nil)
		if err != nil {
			t.Fatalf("turn %d: %v", turn, err)
		}
		// Turn 0 has no previous turn; turns 1 and 2 make the run of
		// stable turns; from turn 3 on the previous turn answers.
		if prefixed := turn >= 3; whole == prefixed {
			t.Fatalf("turn %d: whole %v", turn, whole)
		}
		switch {
		case whole && !slices.Equal(toks, want):
			t.Fatalf("turn %d: the tokens are not the render's", turn)
		case !whole && (!slices.Equal(toks, prevToks[:len(prevToks)-1]) || !slices.Equal(want[:len(toks)], toks)):
			t.Fatalf("turn %d: %d tokens are not the previous turn's but its last, or not a prefix of the render", turn, len(toks))
		}
		prevToks = want
		// The turn's answer takes time: its background render lands.
		wait.For(t, 10*time.Second, "the background render", func() bool { return r.Stats().Stable == uint64(turn) })
	}
	if st := r.Stats(); st.Prefix != 3 || st.Rendered != 6 || st.Unstable != 0 || st.VerifyFailed != 0 || st.Latency.Count != 6 {
		t.Fatalf("%+v", st)
	}
}

// TestRenderPrefixEarlierTurn: while the background render of a
// conversation's previous turn is still running, its next turn is
// answered at once from the turn before that (its tokens but the last are
// as much a prefix of the prompt), not made to wait for its own render;
// once the renders land, the turn after is answered from its previous
// turn again.
func TestRenderPrefixEarlierTurn(t *testing.T) {
	var hold atomic.Bool
	release := make(chan struct{})
	front := renderFront(t, renderSim(t), func(w http.ResponseWriter, req *http.Request) bool {
		if !hold.Load() {
			return false
		}
		select {
		case <-release:
			return false
		case <-req.Context().Done(): // the call gave up
			http.Error(w, `{"error":{"message":"held"}}`, http.StatusServiceUnavailable)
			return true
		}
	})
	var releaseOnce sync.Once
	unhold := func() { releaseOnce.Do(func() { hold.Store(false); close(release) }) }
	t.Cleanup(unhold) // before the front closes, should the test stop early
	r := newTestRenderer(t, RenderOptions{URL: front, Timeout: 2 * time.Second, PrefixAfter: 1})
	msgs := []sim.Message{{Role: "system", Content: renderText("sys", 40)}, {Role: "user", Content: "q0"}}
	renders := make([][]uint32, 0, 5)
	// Turns 0 and 1 are rendered (turn 1 makes the stable run); turns 2
	// and 3 are answered from turn 1's render, turn 4 from turn 3's.
	from := map[int]int{2: 1, 3: 1, 4: 3}
	for turn := range 5 {
		msgs = nextTurn(msgs, turn)
		renders = append(renders, sim.TokenIDs(sim.RenderChat(msgs)))
		if turn == 2 {
			hold.Store(true) // turn 2's and turn 3's background renders wait
		}
		toks, whole, err := r.RenderPrefix(context.Background(), oai.KindChat, renderChatBody(t, msgs, nil), nil)
		if err != nil {
			t.Fatalf("turn %d: %v", turn, err)
		}
		p, prefixed := from[turn]
		switch {
		case whole == prefixed:
			t.Fatalf("turn %d: whole %v", turn, whole)
		case !prefixed && !slices.Equal(toks, renders[turn]):
			t.Fatalf("turn %d: the tokens are not the render's", turn)
		case prefixed && (!slices.Equal(toks, renders[p][:len(renders[p])-1]) || !slices.Equal(renders[turn][:len(toks)], toks)):
			t.Fatalf("turn %d: %d tokens are not turn %d's but its last, or not a prefix of the render", turn, len(toks), p)
		}
		switch turn {
		case 2: // its background render is held
		case 3:
			unhold()
			wait.For(t, 10*time.Second, "turns 2 and 3's background renders", func() bool { return r.Stats().Rendered == 4 })
		default:
			wait.For(t, 10*time.Second, "the turn's render", func() bool { return r.Stats().Rendered == uint64(turn+1) })
		}
	}
	wait.For(t, 10*time.Second, "turn 4's comparison", func() bool { return r.Stats().Stable == 4 })
	if st := r.Stats(); st.Prefix != 3 || st.Unstable != 0 || st.VerifyFailed != 0 {
		t.Fatalf("%+v", st)
	}
}

// TestRenderPrefixBehind: with every background slot taken (the
// renderer far behind), a next turn is still answered from its previous
// turn's render, at once, and makes no render of its own (Unverified);
// the turn after it is answered from the same earlier render.
func TestRenderPrefixBehind(t *testing.T) {
	r := newTestRenderer(t, RenderOptions{URL: renderSim(t), Timeout: 5 * time.Second, PrefixAfter: 1})
	msgs := []sim.Message{{Role: "system", Content: renderText("sys", 40)}, {Role: "user", Content: "q0"}}
	var first []uint32
	for turn := range 4 {
		msgs = nextTurn(msgs, turn)
		want := sim.TokenIDs(sim.RenderChat(msgs))
		if turn == 2 {
			for range cap(r.verifying) {
				r.verifying <- struct{}{} // as if rdVerifyMax renders ran
			}
		}
		toks, whole, err := r.RenderPrefix(context.Background(), oai.KindChat, renderChatBody(t, msgs, nil), nil)
		switch {
		case err != nil:
			t.Fatalf("turn %d: %v", turn, err)
		case turn < 2 && (!whole || !slices.Equal(toks, want)):
			t.Fatalf("turn %d: whole %v; want its render", turn, whole)
		case turn >= 2 && (whole || !slices.Equal(toks, first[:len(first)-1]) || !slices.Equal(want[:len(toks)], toks)):
			t.Fatalf("turn %d: whole %v, %d tokens; want turn 1's but the last", turn, whole, len(toks))
		}
		if turn == 1 {
			first = want
		}
	}
	for range cap(r.verifying) {
		<-r.verifying
	}
	if st := r.Stats(); st.Prefix != 2 || st.Unverified != 2 || st.Rendered != 2 || st.VerifyFailed != 0 {
		t.Fatalf("%+v", st)
	}
}

// TestRenderPrefixUnstable: a background render that finds the previous
// turn is not its prefix starts the run again, so the next turn waits for
// its own render; a failed background render is counted.
func TestRenderPrefixUnstable(t *testing.T) {
	answers := [][]uint32{{1, 2, 3}, {1, 2, 3, 4, 5}, {1, 2, 9, 4, 5, 6, 7}, {1, 2, 9, 4, 5, 6, 7, 8, 9}}
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		i := int(n.Add(1)) - 1
		if i >= len(answers) {
			http.Error(w, `{"error":{"message":"no more"}}`, http.StatusInternalServerError)
			return
		}
		_, _ = io.WriteString(w, `{"token_ids":`+tokenList(answers[i])+`}`)
	}))
	t.Cleanup(srv.Close)
	r := newTestRenderer(t, RenderOptions{URL: srv.URL, Timeout: 5 * time.Second, PrefixAfter: 1})
	msgs := []sim.Message{{Role: "user", Content: "q0"}}
	next := func() (bool, []uint32) {
		t.Helper()
		toks, whole, err := r.RenderPrefix(context.Background(), oai.KindChat, renderChatBody(t, msgs, nil), nil)
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, sim.Message{Role: "assistant", Content: "a"}, sim.Message{Role: "user", Content: "q"})
		return whole, toks
	}
	next() // turn 0: rendered
	if whole, _ := next(); !whole {
		t.Fatal("turn 1 was not rendered: no stable turn yet")
	}
	// Turn 1 was stable: turn 2 is answered from it, and its background
	// render (answers[2]) diverges at the third token.
	if whole, toks := next(); whole || !slices.Equal(toks, []uint32{1, 2, 3, 4}) {
		t.Fatalf("turn 2: whole %v, %v", whole, toks)
	}
	wait.For(t, 10*time.Second, "the unstable background render", func() bool { return r.Stats().Unstable == 1 })
	if whole, toks := next(); !whole || !slices.Equal(toks, answers[3]) {
		t.Fatalf("turn 3 after an unstable turn: whole %v, %v", whole, toks)
	}
	// Turn 3 was stable again: turn 4 is answered from it; its background
	// render fails.
	if whole, _ := next(); whole {
		t.Fatal("turn 4 was rendered, not answered from turn 3")
	}
	wait.For(t, 10*time.Second, "the failed background render", func() bool { return r.Stats().VerifyFailed == 1 })
	if st := r.Stats(); st.Prefix != 2 || st.Stable != 2 || st.Unstable != 1 {
		t.Fatalf("%+v", st)
	}
}

// TestRenderLate: with a renderer slower than the deadline every call
// falls back, but each render is finished in the background and cached,
// so the conversation's turns still compare with their previous turn and,
// once PrefixAfter turns were stable, a next turn is answered at once from
// its previous turn's tokens. A background render the renderer fails is
// counted, and nothing is cached from it.
func TestRenderLate(t *testing.T) {
	var fail atomic.Bool
	front := renderFront(t, renderSim(t), func(w http.ResponseWriter, _ *http.Request) bool {
		time.Sleep(200 * time.Millisecond)
		if fail.Load() {
			http.Error(w, `{"error":{"message":"render failed"}}`, http.StatusInternalServerError)
			return true
		}
		return false
	})
	r := newTestRenderer(t, RenderOptions{URL: front, Timeout: 20 * time.Millisecond, PrefixAfter: 1})
	msgs := []sim.Message{{Role: "system", Content: renderText("sys", 40)}, {Role: "user", Content: "q0"}}
	var prevToks []uint32
	for turn := range 4 {
		msgs = nextTurn(msgs, turn)
		want := sim.TokenIDs(sim.RenderChat(msgs))
		toks, whole, err := r.RenderPrefix(context.Background(), oai.KindChat, renderChatBody(t, msgs, nil), nil)
		// Turn 0 has no previous turn, turn 1's is not yet known to be
		// stable: both miss their deadline. Turn 2 on is answered from
		// the previous turn's late render.
		if turn < 2 {
			if !errors.Is(err, ErrRenderTimeout) || len(toks) != 0 {
				t.Fatalf("turn %d: %d tokens, %v; want the deadline's error", turn, len(toks), err)
			}
		} else if err != nil || whole || !slices.Equal(toks, prevToks[:len(prevToks)-1]) || !slices.Equal(want[:len(toks)], toks) {
			t.Fatalf("turn %d: whole %v, %v: want the previous turn's tokens but the last", turn, whole, err)
		}
		prevToks = want
		wait.For(t, 10*time.Second, "the late render", func() bool {
			st := r.Stats()
			return st.Late+st.Prefix == uint64(turn+1) && st.Rendered == uint64(turn+1)
		})
		if turn == 0 {
			// The call failed, but the renderer answered since: renders
			// succeed, however long nothing else is asked of it.
			if st := r.Stats(); st.Failing(time.Now().Add(2 * FailingAfter)) {
				t.Fatalf("failing after a late render: last success %v, last fallback %v", st.LastSuccess, st.LastFallback)
			}
		}
	}
	if st := r.Stats(); st.Late != 2 || st.Prefix != 2 || st.FallbackTimeout != 2 || st.Stable != 3 || st.Unstable != 0 || st.VerifyFailed != 0 {
		t.Fatalf("%+v", st)
	}
	// A new conversation whose late render fails: counted, not cached,
	// so its next turn waits for its own render again.
	fail.Store(true)
	other := []sim.Message{{Role: "user", Content: renderText("other", 30)}}
	if _, err := r.Render(context.Background(), oai.KindChat, renderChatBody(t, other, nil), nil); !errors.Is(err, ErrRenderTimeout) {
		t.Fatalf("failing render: %v", err)
	}
	wait.For(t, 10*time.Second, "the failed late render", func() bool { return r.Stats().VerifyFailed == 1 })
	if st := r.Stats(); st.Late != 2 || st.CacheEntries != 1 || !st.Failing(time.Now().Add(2*FailingAfter)) {
		t.Fatalf("after a failed late render: %+v; want only the first conversation cached, and renders failing", st)
	}
}

// nextTurn is the conversation msgs at turn: an answer and a question
// more than at the turn before (turn 0 is msgs as they are).
func nextTurn(msgs []sim.Message, turn int) []sim.Message {
	if turn == 0 {
		return msgs
	}
	return append(msgs, sim.Message{Role: "assistant", Content: renderText("answer", 20+turn)}, sim.Message{Role: "user", Content: renderText("question", 5+turn)})
}

func tokenList(toks []uint32) string {
	b := []byte{'['}
	for i, t := range toks {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendUint(b, uint64(t), 10)
	}
	return string(append(b, ']'))
}
