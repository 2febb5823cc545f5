package router

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkRoute measures Router.Route with every registered policy over 8
// replicas, for requests of 64 sessions with 8k-token prompts (keys of one
// value per 16-token block), each prefilled at once.
func BenchmarkRoute(b *testing.B) {
	for _, e := range Policies() {
		b.Run(e.Name, func(b *testing.B) {
			f := newTestFleet(b, 8)
			r, err := NewNamed(f, e.Name, Deps{Sessions: NewSessions(time.Minute)}, nil)
			if err != nil {
				b.Fatal(err)
			}
			reqs := make([]Request, 64)
			for i := range reqs {
				reqs[i] = Request{Session: fmt.Sprint("s", i), Key: seqKey(uint32(i), 512), Tokens: 8 << 10}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				dec, err := r.Route(&reqs[i%len(reqs)], nil)
				if err != nil {
					b.Fatal(err)
				}
				dec.Started()
			}
		})
	}
}
