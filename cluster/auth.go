package cluster

import (
	"crypto/hmac"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"os"
	"sync"

	"github.com/kvroute/kvroute/config"
)

// Every message between instances (batches, resync requests, the
// leader's asks and answers) is sealed: after its two magic bytes and its
// version come macLen bytes of HMAC-SHA256, under the cluster's message
// key, of the magic, the version and the rest. A receiver checks them
// before it decodes anything, so that what a non-member publishes (a
// client of a shared nats_url server, say) is dropped and counted.
//
// The keys derive from the cluster's credential: cluster.token, or, with
// mutual TLS alone, the bytes of cluster.tls.ca_file; each with the
// cluster name. The message key authenticates; the digest key makes the
// digests that stand for session IDs and response ids on the wire
// (router.PeerDigest).
const macLen = 16

// keys are a cluster's derived keys.
type keys struct {
	message, digest []byte
}

// deriveKeys derives c's keys from its token, or from its CA's bytes.
func deriveKeys(c config.Cluster) (keys, error) {
	secret := []byte(c.Token)
	kind := "token"
	if c.Token == "" {
		if c.TLS.CAFile == "" {
			return keys{}, errors.New("cluster: no credential to derive the message key from (cluster.token or cluster.tls.ca_file)")
		}
		b, err := os.ReadFile(c.TLS.CAFile)
		if err != nil {
			return keys{}, fmt.Errorf("cluster.tls.ca_file: %w", err)
		}
		secret, kind = b, "ca"
	}
	root := mac([]byte("kvroute cluster "+kind+" "+c.Name), secret)
	return keys{message: mac(root, []byte("message")), digest: mac(root, []byte("digest"))}, nil
}

// mac is HMAC-SHA256(key, msg).
func mac(key, msg []byte) []byte {
	h := hmac.New(sha256.New, key)
	_, _ = h.Write(msg)
	return h.Sum(nil)
}

// sealer seals and opens messages under the message key. Safe for
// concurrent use.
type sealer struct {
	pool sync.Pool // of *macHasher
}

// macHasher is an HMAC-SHA256 under the message key with room for its
// sum, so that sealing and opening allocate nothing.
type macHasher struct {
	h   hash.Hash
	sum [sha256.Size]byte
}

func newSealer(key []byte) *sealer {
	k := append([]byte(nil), key...)
	return &sealer{pool: sync.Pool{New: func() any { return &macHasher{h: hmac.New(sha256.New, k)} }}}
}

// start begins a message of magic m1 and version ver in b: the magic, the
// version and room for the MAC, which seal fills.
func start(b []byte, m1, ver byte) []byte {
	b = append(b, wireMagic0, m1, ver)
	return append(b, make([]byte, macLen)...)
}

// sum computes msg's MAC into out (macLen bytes).
func (s *sealer) sum(msg []byte, out []byte) {
	mh := s.pool.Get().(*macHasher) //nolint:forcetypeassert // the pool holds only these
	mh.h.Reset()
	_, _ = mh.h.Write(msg[:3])
	_, _ = mh.h.Write(msg[3+macLen:])
	copy(out, mh.h.Sum(mh.sum[:0]))
	s.pool.Put(mh)
}

// seal fills the MAC of msg, begun by start, and returns it.
func (s *sealer) seal(msg []byte) []byte {
	s.sum(msg, msg[3:3+macLen])
	return msg
}

// Errors of open.
var errAuth = errors.New("message not sealed by a member (bad MAC)")

// open checks msg's magic m1, version ver and MAC, and returns what
// follows the MAC.
func (s *sealer) open(msg []byte, m1, ver byte) ([]byte, error) {
	if len(msg) < 3+macLen || msg[0] != wireMagic0 || msg[1] != m1 {
		return nil, errMagic
	}
	if msg[2] != ver {
		return nil, fmt.Errorf("%w %d", errVersion, msg[2])
	}
	var want [macLen]byte
	s.sum(msg, want[:])
	if !hmac.Equal(want[:], msg[3:3+macLen]) {
		return nil, errAuth
	}
	return msg[3+macLen:], nil
}
