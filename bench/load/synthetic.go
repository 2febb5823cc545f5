package load

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Namespaces of the synthetic text streams, so that different workloads
// and different parts of one workload never share text by accident.
var (
	tagSystem   = strSeed("multiturn-system")
	tagUser     = strSeed("multiturn-user")
	tagAnswer   = strSeed("multiturn-answer")
	tagHot      = strSeed("hotprefix-hot")
	tagCold     = strSeed("hotprefix-cold")
	tagSuffix   = strSeed("hotprefix-suffix")
	tagNoReuse  = strSeed("noreuse")
	tagArrivals = strSeed("arrivals")
	tagPick     = strSeed("pick")
)

// poissonArrivals returns n arrival offsets of a Poisson process of rate
// req/s (exponential gaps, the first one included). A non-positive rate
// puts every arrival at 0.
func poissonArrivals(n int, rate float64, seed uint64) []time.Duration {
	out := make([]time.Duration, n)
	if rate <= 0 {
		return out
	}
	r := splitmix64{mix(tagArrivals, seed)}
	t := 0.0
	for i := range out {
		t = r.nextArrival(t, rate)
		out[i] = time.Duration(t * float64(time.Second))
	}
	return out
}

// nextArrival is the arrival after one at t (seconds) of a Poisson process
// of rate req/s: t plus an exponential gap drawn from r.
func (r *splitmix64) nextArrival(t, rate float64) float64 {
	return t - math.Log(1-r.float64())/rate
}

// MultiTurnOptions configures MultiTurn.
type MultiTurnOptions struct {
	// Users is the number of users (sessions); at least 1.
	Users int
	// SystemPrompts is the number of distinct system prompts, shared by the
	// users round-robin (user u gets prompt u mod SystemPrompts). 0 (or
	// SystemTokens 0) sends no system message.
	SystemPrompts int
	// SystemTokens is the length of each system prompt.
	SystemTokens int
	// Turns is the number of turns per user; at least 1.
	Turns int
	// Think is the think time between a turn's answer and the next turn.
	Think time.Duration
	// UserTokens is the length of each new user message (default 64).
	UserTokens int
	// AnswerTokens is max_tokens of every turn, and the length of the
	// synthesized assistant answer included in the following turns
	// (default 128).
	AnswerTokens int
	// Duration spreads the users' first turns over [0, Duration) as a
	// Poisson process (uniform order statistics); 0 starts them all at 0.
	Duration time.Duration
	// Placeholders makes the turns send the workload's placeholder answers
	// as they are. By default every turn after the first carries back the
	// answers the earlier turns actually received (Request.SendsAnswer), as
	// a chat client does; against replicas that cache generated tokens, each
	// turn then also hits the previous answer.
	Placeholders bool
	// Seed makes the workload reproducible.
	Seed uint64
}

// MultiTurn returns multi-turn chat sessions: each of Users users starts at
// a random time within Duration and holds Turns turns. Turn k sends the
// system prompt, then every earlier user message followed by its answer,
// then the new user message; so every turn's messages extend the previous
// turn's. The assistant messages are placeholders of AnswerTokens tokens of
// deterministic synthetic text; unless Placeholders is set, every turn after
// the first has SendsAnswer (AnswerOf the previous turn), so Run replaces
// them by the answers the earlier turns actually received, as a chat client
// does. Turn k depends on turn k-1 (DependsOn) with think time Think; its At
// is a lower bound (the user's arrival plus k think times). Session is
// "user-N".
func MultiTurn(opt MultiTurnOptions) *Workload {
	users := max(opt.Users, 1)
	turns := max(opt.Turns, 1)
	userTok := opt.UserTokens
	if userTok <= 0 {
		userTok = 64
	}
	ansTok := opt.AnswerTokens
	if ansTok <= 0 {
		ansTok = 128
	}
	var systems []string
	if opt.SystemPrompts > 0 && opt.SystemTokens > 0 {
		systems = make([]string, opt.SystemPrompts)
		for s := range systems {
			systems[s] = synthText(mix(tagSystem, opt.Seed, uint64(s)), opt.SystemTokens)
		}
	}
	starts := make([]time.Duration, users)
	if opt.Duration > 0 {
		r := splitmix64{mix(tagArrivals, opt.Seed)}
		for u := range starts {
			starts[u] = time.Duration(r.float64() * float64(opt.Duration))
		}
		slices.Sort(starts)
	}
	w := &Workload{
		Name:        fmt.Sprintf("multiturn(users=%d,turns=%d,system=%dx%d)", users, turns, len(systems), opt.SystemTokens),
		Requests:    make([]Request, 0, users*turns),
		HasSessions: true,
	}
	for u := 0; u < users; u++ {
		var msgs []Message
		if systems != nil {
			msgs = append(msgs, Message{Role: roleSystem, Content: systems[u%len(systems)]})
		}
		prev := -1
		at := starts[u]
		for k := 0; k < turns; k++ {
			if k > 0 {
				at += opt.Think
				msgs = append(msgs, Message{Role: roleAssistant, Content: synthText(mix(tagAnswer, opt.Seed, uint64(u), uint64(k-1)), ansTok)})
			}
			msgs = append(msgs, Message{Role: roleUser, Content: synthText(mix(tagUser, opt.Seed, uint64(u), uint64(k)), userTok)})
			turn := slices.Clip(slices.Clone(msgs))
			think := time.Duration(0)
			if k > 0 {
				think = opt.Think
			}
			sends := !opt.Placeholders && k > 0
			answerOf := 0
			if sends {
				answerOf = prev
			}
			w.Requests = append(w.Requests, Request{
				At:           at,
				Session:      "user-" + strconv.Itoa(u),
				Messages:     turn,
				MaxTokens:    ansTok,
				PromptTokens: tokensOf(len(renderChat(turn))),
				DependsOn:    prev,
				Think:        think,
				SendsAnswer:  sends,
				AnswerOf:     answerOf,
			})
			prev = len(w.Requests) - 1
		}
	}
	sortByArrival(w.Requests)
	return w
}

// HotPrefixOptions configures HotPrefix.
type HotPrefixOptions struct {
	// N is the number of requests.
	N int
	// Rate is the mean arrival rate in req/s (Poisson); 0 sends all at once.
	Rate float64
	// Share (0–1) is the fraction of requests that carry the hot prefix;
	// exactly round(Share*N) of them do.
	Share float64
	// PrefixTokens is the length of the prefix (hot or unique).
	PrefixTokens int
	// SuffixTokens is the length of each request's unique suffix.
	SuffixTokens int
	// MaxTokens is max_tokens (default 128).
	MaxTokens int
	// Seed makes the workload reproducible.
	Seed uint64
}

// HotPrefix returns N requests arriving at Rate, of which a Share carry one
// hot prefix (a system message of PrefixTokens) and the rest a unique
// prefix of the same length; every request ends with a unique user message
// of SuffixTokens. Which requests are hot is a seeded random choice.
func HotPrefix(opt HotPrefixOptions) *Workload {
	n := max(opt.N, 0)
	maxTok := opt.MaxTokens
	if maxTok <= 0 {
		maxTok = 128
	}
	share := min(max(opt.Share, 0), 1)
	hotN := int(math.Round(share * float64(n)))
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	r := splitmix64{mix(tagPick, opt.Seed)}
	for i := n - 1; i > 0; i-- {
		j := r.intn(i + 1)
		order[i], order[j] = order[j], order[i]
	}
	hot := make([]bool, n)
	for _, i := range order[:hotN] {
		hot[i] = true
	}
	hotText := synthText(mix(tagHot, opt.Seed), opt.PrefixTokens)
	at := poissonArrivals(n, opt.Rate, opt.Seed)
	w := &Workload{
		Name:     fmt.Sprintf("hotprefix(n=%d,share=%.2f,prefix=%d,suffix=%d)", n, share, opt.PrefixTokens, opt.SuffixTokens),
		Requests: make([]Request, n),
	}
	for i := range w.Requests {
		prefix := hotText
		if !hot[i] {
			prefix = synthText(mix(tagCold, opt.Seed, uint64(i)), opt.PrefixTokens)
		}
		msgs := []Message{
			{Role: roleSystem, Content: prefix},
			{Role: roleUser, Content: synthText(mix(tagSuffix, opt.Seed, uint64(i)), opt.SuffixTokens)},
		}
		w.Requests[i] = Request{
			At:           at[i],
			Messages:     msgs,
			MaxTokens:    maxTok,
			PromptTokens: tokensOf(len(renderChat(msgs))),
			DependsOn:    -1,
		}
	}
	return w
}

// NoReuseOptions configures NoReuse.
type NoReuseOptions struct {
	// N is the number of requests. With TraceArrivals, 0 means every row
	// of the trace.
	N int
	// Rate is the mean arrival rate in req/s (Poisson); 0 sends all at
	// once. Ignored with TraceArrivals.
	Rate float64
	// PromptTokens is the prompt length when AzurePath is empty (default
	// 1024).
	PromptTokens int
	// MaxTokens is max_tokens. 0 means the trace's GeneratedTokens when
	// AzurePath is set, else 128.
	MaxTokens int
	// MaxTokensCap caps max_tokens; 0 means no cap.
	MaxTokensCap int
	// AzurePath, when set, is an Azure LLM inference trace CSV
	// (TIMESTAMP,ContextTokens,GeneratedTokens); prompt and output lengths
	// are drawn from its rows at random (seeded).
	AzurePath string
	// TraceArrivals takes the first N rows of the Azure trace in order,
	// with their arrival times, instead of random rows at Rate. It needs
	// AzurePath.
	TraceArrivals bool
	// TimeScale multiplies the offsets of TraceArrivals (0 means 1).
	TimeScale float64
	// Seed makes the workload reproducible.
	Seed uint64
}

// azureRow is one row of an Azure LLM inference trace.
type azureRow struct {
	at           time.Duration // from the first row
	context, gen int
}

// readAzure reads an Azure LLM inference trace CSV.
func readAzure(path string) ([]azureRow, error) {
	f, err := openTrace(TraceAzure, path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	cr := csv.NewReader(f)
	cr.FieldsPerRecord = 3
	cr.ReuseRecord = true
	var rows []azureRow
	var t0 time.Time
	for line := 1; ; line++ {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if line == 1 && strings.EqualFold(strings.TrimSpace(rec[0]), "TIMESTAMP") {
			continue
		}
		ts, err := time.Parse("2006-01-02 15:04:05.999999999", strings.TrimSpace(rec[0]))
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, line, err)
		}
		ctx, err1 := strconv.Atoi(strings.TrimSpace(rec[1]))
		gen, err2 := strconv.Atoi(strings.TrimSpace(rec[2]))
		if err := errors.Join(err1, err2); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, line, err)
		}
		if len(rows) == 0 {
			t0 = ts
		}
		rows = append(rows, azureRow{at: ts.Sub(t0), context: ctx, gen: gen})
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("%s: no rows", path)
	}
	return rows, nil
}

// NoReuse returns requests with unique prompts and no shared prefix at all
// (beyond the role marker): every prompt is a single user message of
// synthetic text seeded by the request index. Lengths are PromptTokens, or
// drawn from the Azure trace at AzurePath.
func NoReuse(opt NoReuseOptions) (*Workload, error) {
	n := max(opt.N, 0)
	if opt.TraceArrivals && opt.AzurePath == "" {
		return nil, &TraceError{Kind: TraceAzure, For: "replaying the trace's arrivals"}
	}
	var rows []azureRow
	if opt.AzurePath != "" {
		var err error
		if rows, err = readAzure(opt.AzurePath); err != nil {
			return nil, err
		}
		if opt.TraceArrivals && (n == 0 || n > len(rows)) {
			n = len(rows)
		}
	}
	promptTok := opt.PromptTokens
	if promptTok <= 0 {
		promptTok = 1024
	}
	var at []time.Duration
	if !opt.TraceArrivals || rows == nil {
		at = poissonArrivals(n, opt.Rate, opt.Seed)
	}
	scale := opt.TimeScale
	if scale <= 0 {
		scale = 1
	}
	pick := splitmix64{mix(tagPick, opt.Seed)}
	w := &Workload{Name: fmt.Sprintf("noreuse(n=%d)", n), Requests: make([]Request, n)}
	for i := range w.Requests {
		ptok, otok := promptTok, 128
		var arrive time.Duration
		if rows != nil {
			var row azureRow
			if opt.TraceArrivals {
				row = rows[i]
				arrive = time.Duration(float64(row.at) * scale)
			} else {
				row = rows[pick.intn(len(rows))]
			}
			ptok, otok = max(row.context, 1), max(row.gen, 1)
		}
		if at != nil {
			arrive = at[i]
		}
		if opt.MaxTokens > 0 {
			otok = opt.MaxTokens
		}
		if opt.MaxTokensCap > 0 {
			otok = min(otok, opt.MaxTokensCap)
		}
		msgs := []Message{{Role: roleUser, Content: synthText(mix(tagNoReuse, opt.Seed, uint64(i)), ptok)}}
		w.Requests[i] = Request{
			At:           arrive,
			Messages:     msgs,
			MaxTokens:    otok,
			PromptTokens: tokensOf(len(renderChat(msgs))),
			DependsOn:    -1,
		}
	}
	return w, nil
}
