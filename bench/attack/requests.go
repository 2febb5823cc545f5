package attack

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ParseBytesPerBodyByte is docs/memory.md's request-parsing multiple: a
// request's routing fields (its parsed messages, parts and prompt, its
// tokens and routing key) cost at most this many bytes per byte of its
// body (tokenize's TestRoutingCostBoundedByBody holds it to that).
const ParseBytesPerBodyByte = 5

// The many-messages attack's size: the figures (tests make them
// smaller).
var manyRequests, manyMessagesEach = 24, 100_000

// manyMessagesBody is a chat body of n short messages.
func manyMessagesBody(n int) string {
	var b strings.Builder
	b.WriteString(`{"model":"` + Model + `","messages":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"role":"user","content":"hi ` + strconv.Itoa(i) + `"}`)
	}
	b.WriteString("]}")
	return b.String()
}

// manyMessages sends manyRequests requests of manyMessagesEach messages each,
// all at once, and reads kvroute's peak resident memory: held when each
// request grew it by no more than its body and its routing fields at
// ParseBytesPerBodyByte, twice over for the garbage collector's headroom,
// plus the per-request state of docs/memory.md, and every request was
// answered.
func manyMessages(e *env) (Result, error) {
	if !MemSupported {
		return Result{}, errNoMem
	}
	k, _, stop, err := e.start("many-messages", 1, Settings{"limits.max_body_bytes": 8 << 20})
	if err != nil {
		return Result{}, err
	}
	defer stop()
	base, err := baseline(k)
	if err != nil {
		return Result{}, err
	}
	n := manyRequests
	body := manyMessagesBody(manyMessagesEach)
	answers := sendAtOnce(k, chatRequest(k.addr, body), n)
	if !k.alive() {
		return Result{}, fmt.Errorf("kvroute exited%s", tailOf(k))
	}
	peak, err := ReadMem(k.pid())
	if err != nil {
		return Result{}, err
	}
	ok := 0
	for _, a := range answers {
		if normalOK(a) {
			ok++
		}
	}
	per := (peak.HWM - base.RSS) / int64(n)
	limit := GCFactor*(1+ParseBytesPerBodyByte)*int64(len(body)) + RequestStateBytes
	return Result{Held: per <= limit && ok == n, Figure: fmt.Sprintf(
		"%d requests of %d messages (%s each) at once: peak RSS %s (baseline %s), %s per request against %s allowed; %d of %d answered",
		n, manyMessagesEach, mib(int64(len(body))), mib(peak.HWM), mib(base.RSS), mib(per), mib(limit), ok, n)}, nil
}

// guessPrompt is a prompt long enough for cache_aware to keep its prefix
// (policies.cache_aware.min_match_tokens), made unique by tag.
func guessPrompt(tag string) string {
	return `{"model":"` + Model + `","messages":[{"role":"user","content":"` + tag + ": " +
		strings.Repeat("the quarterly figures for the northern region are confidential. ", 80) + `"}]`
}

// varying are the answer headers that differ between any two answers.
var varying = map[string]bool{"Date": true, "X-Request-Id": true}

// routeOracle: a client sends a prompt; another then guesses it right and
// wrong. With the defaults, held when neither answer carries a route
// reason and no header tells the two guesses apart.
func routeOracle(e *env) (Result, error) {
	k, _, stop, err := e.start("route-oracle", 1, nil)
	if err != nil {
		return Result{}, err
	}
	defer stop()
	secret := guessPrompt("account 4471") + "}"
	if a := do(k.addr, chatRequest(k.addr, secret), 10*time.Second); !normalOK(a) {
		return Result{}, fmt.Errorf("the victim's request: %s", describe(a))
	}
	right := do(k.addr, chatRequest(k.addr, secret), 10*time.Second)
	wrong := do(k.addr, chatRequest(k.addr, guessPrompt("account 4472")+"}"), 10*time.Second)
	if !normalOK(right) || !normalOK(wrong) {
		return Result{}, fmt.Errorf("guesses: %s, %s", describe(right), describe(wrong))
	}
	differ := headerDiff(right.Header, wrong.Header)
	reason := right.Header.Get("X-Kvroute-Route") + wrong.Header.Get("X-Kvroute-Route")
	return Result{Held: reason == "" && len(differ) == 0, Figure: fmt.Sprintf(
		"right guess: X-Kvroute-Route %q; wrong guess: %q; headers that differ: %s",
		right.Header.Get("X-Kvroute-Route"), wrong.Header.Get("X-Kvroute-Route"), orNone(differ))}, nil
}

// headerDiff names the headers, but those in varying, whose values differ
// between a and b.
func headerDiff(a, b http.Header) []string {
	var out []string
	seen := map[string]bool{}
	for _, h := range []http.Header{a, b} {
		for name := range h {
			if varying[name] || seen[name] {
				continue
			}
			seen[name] = true
			if strings.Join(a.Values(name), ",") != strings.Join(b.Values(name), ",") {
				out = append(out, name)
			}
		}
	}
	return out
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}

// saltIsolation: two clients send the same prompt under different
// cache_salt values (expose_route_reason on, to read the decisions).
// Held when the second salt's first request is no cache hit, while each
// salt's repeat is one (the prefix is kept, per salt).
func saltIsolation(e *env) (Result, error) {
	k, _, stop, err := e.start("salt-isolation", 2, Settings{"expose_route_reason": true})
	if err != nil {
		return Result{}, err
	}
	defer stop()
	prompt := guessPrompt("shared document")
	route := func(salt string) (string, error) {
		a := do(k.addr, chatRequest(k.addr, prompt+`,"cache_salt":"`+salt+`"}`), 10*time.Second)
		if !normalOK(a) {
			return "", fmt.Errorf("salt %s: %s", salt, describe(a))
		}
		return a.Header.Get("X-Kvroute-Route"), nil
	}
	var got [4]string
	for i, salt := range []string{"tenant-a", "tenant-b", "tenant-a", "tenant-b"} {
		if got[i], err = route(salt); err != nil {
			return Result{}, err
		}
	}
	hit := func(r string) bool { return strings.HasPrefix(r, "cache_hit") }
	return Result{Held: !hit(got[1]) && hit(got[2]) && hit(got[3]), Figure: fmt.Sprintf(
		"salt a: %q; the same prompt under salt b: %q; a again: %q; b again: %q", got[0], got[1], got[2], got[3])}, nil
}

// manyMessagesMem measures kvroute's memory while n requests of each
// messages are sent at once; under a small body budget some are refused
// with 503 (body_budget_exhausted), which is the bound at work.
func manyMessagesMem(k *kvroute, n, each int) (memRun, int, error) {
	raw := chatRequest(k.addr, manyMessagesBody(each))
	refused := 0
	m, err := underAttack(k, &holders{}, 0, func() error {
		for _, a := range sendAtOnce(k, raw, n) {
			switch {
			case normalOK(a):
			case a.Err == nil && a.Status == 503 && isOpenAIError(a.Body):
				refused++
			default:
				return fmt.Errorf("a request of %d messages: %s %.200s", each, describe(a), a.Body)
			}
		}
		return nil
	})
	return m, refused, err
}

// sendAtOnce sends raw to k n times at once and returns the answers.
func sendAtOnce(k *kvroute, raw []byte, n int) []Answer {
	answers := make([]Answer, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { answers[i] = do(k.addr, raw, time.Minute) })
	}
	wg.Wait()
	return answers
}
