package chaos

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/bench/sim"
)

// Report is the result of a chaos run.
type Report struct {
	Options Options `json:"options"`
	// Phases, in timeline order; requests count in the phase they were
	// sent in.
	Phases []PhaseResult `json:"phases"`
	// Faults, in the order injected.
	Faults []FaultResult `json:"faults"`

	Sent      int `json:"sent"`
	Succeeded int `json:"succeeded"`
	// Retried counts requests seen by more than one replica;
	// RetriesMetric is kvroute_retries_total's increase over the run
	// (which also counts attempts that never reached a replica).
	Retried       int     `json:"retried"`
	RetriesMetric float64 `json:"retries_metric"`
	Failed        int     `json:"failed_clear"`
	Lost          int     `json:"lost"`
	// FailedKinds and LostKinds count failures and losses by kind.
	FailedKinds map[string]int `json:"failed_kinds,omitempty"`
	LostKinds   map[string]int `json:"lost_kinds,omitempty"`
	// LostRequests details every lost request with what the replicas saw.
	LostRequests []RequestResult `json:"lost_requests,omitempty"`
	// RetriedRequests details the requests seen by more than one replica.
	RetriedRequests []RequestResult `json:"retried_requests,omitempty"`
	// Violations lists the requests sent to another replica after one had
	// answered.
	Violations []Violation `json:"violations,omitempty"`
	// EjectionsTotal sums kvroute's ejections of every replica; ConnsReset
	// counts the connections the kills reset.
	EjectionsTotal int `json:"ejections_total"`
	ConnsReset     int `json:"conns_reset"`
	// Transitions are kvroute's health changes, as polled.
	Transitions []Transition `json:"transitions"`
	// Wall is the run's duration in seconds.
	Wall float64 `json:"wall_s"`
}

// PhaseResult counts the requests sent during one phase.
type PhaseResult struct {
	Name      string  `json:"name"`
	StartS    float64 `json:"start_s"`
	EndS      float64 `json:"end_s"`
	Sent      int     `json:"sent"`
	Succeeded int     `json:"succeeded"`
	Retried   int     `json:"retried"`
	Failed    int     `json:"failed_clear"`
	Lost      int     `json:"lost"`
	// ServedBy counts the successful requests per replica (X-Kvroute-Backend).
	ServedBy []int `json:"served_by"`
}

// FaultResult is what kvroute's health tracking made of one fault.
type FaultResult struct {
	Replica int     `json:"replica"`
	Mode    Mode    `json:"mode"`
	StartS  float64 `json:"start_s"`
	EndS    float64 `json:"end_s"`
	// ExpectEject is false for faults kvroute must ride out in service
	// (garbage /metrics).
	ExpectEject bool `json:"expect_eject"`
	// Ejected reports an ejection during the fault; EjectS is the time from
	// the fault's start to the first one; Ejections counts them (a replica
	// whose health check passes while its requests fail is ejected, let
	// back in by the check, and ejected again).
	Ejected   bool    `json:"ejected"`
	EjectS    float64 `json:"eject_s"`
	Ejections int     `json:"ejections"`
	// Cause is the failure kvroute recorded at the first ejection.
	Cause string `json:"cause,omitempty"`
	// Restored reports that the replica was in service at the end of the
	// run; RestoreS is the time from the fault's end until it was healthy
	// for good (0 when it was in service when the fault ended and stayed).
	Restored bool    `json:"restored"`
	RestoreS float64 `json:"restore_s"`
	// OK: ejected and restored, or, when no ejection is expected, never
	// ejected.
	OK bool `json:"ok"`
}

// Violation is a request that reached another replica after an earlier
// replica had answered it.
type Violation struct {
	ID       string        `json:"id"`
	Attempts []AttemptInfo `json:"attempts"`
}

// Pass reports whether nothing was lost and no request went to a second
// replica after an answer.
func (r *Report) Pass() bool { return r.Lost == 0 && len(r.Violations) == 0 }

// analyze builds the report from the client's results, the injectors'
// records, the health transitions and the faults. starts holds each
// phase's start and, last, the end of the load.
func analyze(o *Options, rec *Recorder, results []RequestResult, trans []Transition, faults []*fault, starts []time.Duration, replicas int) *Report {
	roles, _ := o.roles() // checked before the run
	rep := &Report{Options: *o, Transitions: trans, FailedKinds: map[string]int{}, LostKinds: map[string]int{}}
	for i, name := range PhaseNames {
		rep.Phases = append(rep.Phases, PhaseResult{Name: name, StartS: starts[i].Seconds(), EndS: starts[i+1].Seconds(), ServedBy: make([]int, replicas)})
	}
	slices.SortFunc(results, func(a, b RequestResult) int {
		na, _ := strconv.Atoi(strings.TrimPrefix(a.ID, "chaos-"))
		nb, _ := strconv.Atoi(strings.TrimPrefix(b.ID, "chaos-"))
		return na - nb
	})
	for _, res := range results {
		ph := &rep.Phases[res.Phase]
		rep.Sent++
		ph.Sent++
		all := rec.Attempts(res.ID)
		// In a disaggregated fleet every request reaches a prefill replica
		// whose answer goes to kvroute, not to the client: the invariants
		// are the decode side's, and the prefill side is retried when it
		// reached more than one prefill replica.
		atts, prefills := onSides(all, roles)
		if replicasSeen(atts) > 1 || replicasSeen(prefills) > 1 {
			rep.Retried++
			ph.Retried++
			r := res
			r.Attempts = all
			rep.RetriedRequests = append(rep.RetriedRequests, r)
		}
		for k := 0; k+1 < len(atts); k++ {
			if atts[k].AnsweredBefore(atts[k+1].AtMs) {
				rep.Violations = append(rep.Violations, Violation{ID: res.ID, Attempts: atts})
				break
			}
		}
		switch res.Outcome {
		case OK:
			rep.Succeeded++
			ph.Succeeded++
			if i, err := strconv.Atoi(strings.TrimPrefix(res.Backend, "sim-")); err == nil && i >= 0 && i < replicas {
				ph.ServedBy[i]++
			}
		case Failed:
			rep.Failed++
			ph.Failed++
			rep.FailedKinds[res.Kind]++
		default:
			rep.Lost++
			ph.Lost++
			rep.LostKinds[lostKind(res.Kind)]++
			res.Attempts = atts
			rep.LostRequests = append(rep.LostRequests, res)
		}
	}
	for _, f := range faults {
		rep.Faults = append(rep.Faults, faultResult(f, trans))
	}
	return rep
}

// lostKind shortens a loss's kind for counting (drops the error text
// after a colon).
func lostKind(k string) string {
	if i := strings.Index(k, ": "); i >= 0 {
		return k[:i]
	}
	return k
}

// onSides splits atts into those on replicas that answer clients (decode
// or whole) and those on prefill replicas, by roles (nil: every replica
// answers clients).
func onSides(atts []AttemptInfo, roles []string) (answering, prefill []AttemptInfo) {
	if roles == nil {
		return atts, nil
	}
	for _, a := range atts {
		if a.Replica >= 0 && a.Replica < len(roles) && roles[a.Replica] == sim.RolePrefill {
			prefill = append(prefill, a)
		} else {
			answering = append(answering, a)
		}
	}
	return answering, prefill
}

func replicasSeen(atts []AttemptInfo) int {
	var seen []int
	for _, a := range atts {
		if !slices.Contains(seen, a.Replica) {
			seen = append(seen, a.Replica)
		}
	}
	return len(seen)
}

// faultResult reads a fault's ejection and restoration from the health
// transitions.
func faultResult(f *fault, trans []Transition) FaultResult {
	start, end := ms(f.start), ms(f.end)
	fr := FaultResult{Replica: f.replica, Mode: f.mode, StartS: f.start.Seconds(), EndS: f.end.Seconds(),
		ExpectEject: f.mode != ModeGarbageMetrics}
	healthy := true // as the fault ends, then as the run ends
	var lastUp float64 = -1
	for _, t := range trans {
		if t.Replica != f.replica {
			continue
		}
		if t.AtMs >= start && t.AtMs <= end && !t.Healthy {
			fr.Ejections++
			if !fr.Ejected {
				fr.Ejected = true
				fr.EjectS = (t.AtMs - start) / 1000
				fr.Cause = t.Cause
			}
		}
		if t.AtMs > end && t.Healthy {
			lastUp = t.AtMs
		}
		healthy = t.Healthy
	}
	fr.Restored = healthy
	if lastUp >= 0 {
		fr.RestoreS = (lastUp - end) / 1000
	}
	if fr.ExpectEject {
		fr.OK = fr.Ejected && fr.Restored
	} else {
		fr.OK = fr.Ejections == 0 && fr.Restored
	}
	return fr
}

// Markdown renders the report: the phase table, the fault table and the
// verdict.
func (r *Report) Markdown() string {
	var b strings.Builder
	o := &r.Options
	fmt.Fprintf(&b, "## kvroute chaos: nothing lost\n\n")
	fmt.Fprintf(&b, "%d simulated replicas (time scale %g), %g req/s (%.0f%% streamed, max_tokens %d); kvroute cache_aware, retries %d, "+
		"health %v/%v ×%d, first_byte %v, stream_idle %v.\n\n",
		o.Replicas, o.TimeScale, o.Rate, 100*o.StreamShare, o.MaxTokens, o.Retries,
		o.HealthInterval, o.HealthTimeout, o.FailThreshold, o.FirstByte, o.StreamIdle)
	names := make([]string, len(r.Phases[0].ServedBy))
	for i := range names {
		names[i] = strconv.Itoa(i)
	}
	fmt.Fprintf(&b, "| # | phase | at (s) | sent | ok | retried | failed (clear error) | lost | ok served by sim-%s |\n", strings.Join(names, "/"))
	b.WriteString("|---|---|--:|--:|--:|--:|--:|--:|---|\n")
	for i, p := range r.Phases {
		served := make([]string, len(p.ServedBy))
		for k, n := range p.ServedBy {
			served[k] = strconv.Itoa(n)
		}
		fmt.Fprintf(&b, "| %d | %s | %.1f | %d | %d | %d | %d | %d | %s |\n",
			i, p.Name, p.StartS, p.Sent, p.Succeeded, p.Retried, p.Failed, p.Lost, strings.Join(served, "/"))
	}
	fmt.Fprintf(&b, "| | **total** | | **%d** | **%d** | **%d** | **%d** | **%d** | |\n\n",
		r.Sent, r.Succeeded, r.Retried, r.Failed, r.Lost)

	b.WriteString("| fault | replica | from–to (s) | ejected after | ejections | first ejection's cause | restored after | verdict |\n")
	b.WriteString("|---|---|---|--:|--:|---|--:|---|\n")
	for _, f := range r.Faults {
		eject := "not ejected"
		if f.Ejected {
			eject = fmt.Sprintf("%.2f s", f.EjectS)
		}
		restore := "not restored"
		if f.Restored {
			restore = fmt.Sprintf("%.2f s", f.RestoreS)
		}
		verdict := "ok"
		switch {
		case !f.OK && f.ExpectEject:
			verdict = "**FAIL** (expected ejection and restoration)"
		case !f.OK:
			verdict = "**FAIL** (expected to stay in service)"
		case !f.ExpectEject:
			verdict = "ok (stays in service, as it must)"
		}
		cause := "—"
		if f.Cause != "" {
			cause = "`" + strings.ReplaceAll(f.Cause, "|", "/") + "`"
		}
		fmt.Fprintf(&b, "| %s | sim-%d | %.1f–%.1f | %s | %d | %s | %s | %s |\n",
			f.Mode, f.Replica, f.StartS, f.EndS, eject, f.Ejections, cause, restore, verdict)
	}
	b.WriteString("\n")
	fmt.Fprintf(&b, "- **Lost: %d.** Violations (a second replica after an answer reached the client): **%d**.\n", r.Lost, len(r.Violations))
	fmt.Fprintf(&b, "- Retried: %d requests reached more than one replica; kvroute_retries_total rose by %.0f (it also counts attempts refused before reaching a replica).\n",
		r.Retried, r.RetriesMetric)
	fmt.Fprintf(&b, "- Failed with a clear error: %d%s.\n", r.Failed, kinds(r.FailedKinds))
	if r.Lost > 0 {
		fmt.Fprintf(&b, "- Lost by kind:%s.\n", kinds(r.LostKinds))
	}
	fmt.Fprintf(&b, "- kvroute ejections in all: %d; connections reset by the kill: %d; wall %.1f s.\n", r.EjectionsTotal, r.ConnsReset, r.Wall)
	if len(r.LostRequests) > 0 {
		b.WriteString("\nLost requests (first 20):\n\n")
		for _, l := range r.LostRequests[:min(20, len(r.LostRequests))] {
			fmt.Fprintf(&b, "- %s (stream %v, phase %d, %.2f–%.2f s, status %d, backend %q): %s; replicas saw: %s\n",
				l.ID, l.Stream, l.Phase, l.StartMs/1000, l.EndMs/1000, l.Status, l.Backend, l.Kind, attemptsText(l.Attempts))
		}
	}
	if len(r.Violations) > 0 {
		b.WriteString("\nViolations (first 20):\n\n")
		for _, v := range r.Violations[:min(20, len(r.Violations))] {
			fmt.Fprintf(&b, "- %s: %s\n", v.ID, attemptsText(v.Attempts))
		}
	}
	if r.Pass() {
		b.WriteString("\nPASS: nothing lost, no generation sent to a second replica after an answer.\n")
	} else {
		b.WriteString("\nFAIL.\n")
	}
	return b.String()
}

func kinds(m map[string]int) string {
	if len(m) == 0 {
		return ""
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s ×%d", k, m[k]))
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

func attemptsText(as []AttemptInfo) string {
	if len(as) == 0 {
		return "none"
	}
	parts := make([]string, len(as))
	for i, a := range as {
		parts[i] = fmt.Sprintf("sim-%d at %.2fs status %d body %dB", a.Replica, a.AtMs/1000, a.Status, a.BodyBytes)
	}
	return strings.Join(parts, " → ")
}

// Write writes chaos.md and chaos.json into dir.
func (r *Report) Write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, FileMarkdown), []byte(r.Markdown()), 0o644); err != nil {
		return err
	}
	js, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, FileJSON), append(js, '\n'), 0o644)
}
