package backends

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/valyala/fasthttp"
)

// HeaderDataParallelRank pins a request to one data-parallel rank of an
// engine: vLLM's API server and SGLang's data-parallel controller both
// read it.
const HeaderDataParallelRank = "X-Data-Parallel-Rank"

// MaxDataParallelSize bounds Spec.DataParallelSize.
const MaxDataParallelSize = 1024

// ExpandRanks returns specs with each spec of DataParallelSize > 1 turned
// into one spec per rank r, named "<name>-dp<r>", with DataParallelRank r
// and the ports of its KVEvents endpoints raised by r (an engine's rank r
// publishes, and replays, on the configured port + r). Other specs are kept
// as they are. Apply it once, to specs as configured or discovered.
func ExpandRanks(specs []Spec) []Spec {
	n := 0
	for _, s := range specs {
		n += max(1, s.DataParallelSize)
	}
	if n == len(specs) {
		return specs
	}
	out := make([]Spec, 0, n)
	for _, s := range specs {
		if s.DataParallelSize <= 1 {
			out = append(out, s)
			continue
		}
		for r := range s.DataParallelSize {
			c := cloneSpec(s)
			c.Name = s.Name + "-dp" + strconv.Itoa(r)
			c.DataParallelRank = r
			c.KVEvents.Endpoint = OffsetPort(s.KVEvents.Endpoint, r)
			c.KVEvents.ReplayEndpoint = OffsetPort(s.KVEvents.ReplayEndpoint, r)
			out = append(out, c)
		}
	}
	return out
}

// OffsetPort returns the endpoint "scheme://host:port" with its port
// raised by by; an endpoint without a numeric port, or whose port would
// pass 65535, is returned as it is (validation reports it).
func OffsetPort(endpoint string, by int) string {
	i := strings.LastIndexByte(endpoint, ':')
	if by == 0 || i < 0 {
		return endpoint
	}
	p, err := strconv.Atoi(endpoint[i+1:])
	if err != nil || p < 0 || p+by > 65535 {
		return endpoint
	}
	return endpoint[:i+1] + strconv.Itoa(p+by)
}

// checkRank validates a spec's data-parallel fields.
func checkRank(s Spec) error {
	switch {
	case s.DataParallelSize < 0 || s.DataParallelSize > MaxDataParallelSize:
		return fmt.Errorf("data-parallel size %d is not in 0..%d", s.DataParallelSize, MaxDataParallelSize)
	case s.DataParallelSize <= 1 && s.DataParallelRank != 0:
		return errors.New("data-parallel rank set without a data-parallel size above 1")
	case s.DataParallelRank < 0 || (s.DataParallelSize > 1 && s.DataParallelRank >= s.DataParallelSize):
		return fmt.Errorf("data-parallel rank %d is not in 0..%d", s.DataParallelRank, s.DataParallelSize-1)
	}
	return nil
}

// DataParallelRank returns the engine rank the replica stands for and
// true, or false when its spec has no data-parallel size above 1.
func (r *Replica) DataParallelRank() (int, bool) {
	st := r.spec.Load()
	return st.spec.DataParallelRank, st.spec.DataParallelSize > 1
}

// setRankHeader pins req to the replica's rank, replacing any rank the
// client asked for; a replica without ranks leaves req as it is.
func (r *Replica) setRankHeader(req *fasthttp.Request) {
	if st := r.spec.Load(); st.rankHeader != "" {
		req.Header.Set(HeaderDataParallelRank, st.rankHeader)
	}
}
