package proxy

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"strconv"

	"github.com/valyala/fasthttp"

	"github.com/kvroute/kvroute/oai"
)

// SaltOptions have kvroute set each request's cache_salt itself: a keyed
// digest of its tenant (From) written into the forwarded body over any
// the caller sent, so that no caller can share, or time, another
// tenant's prefix cache. The zero value forwards the caller's salt as
// sent.
type SaltOptions struct {
	From TenantSource
	// Key is the digest's secret; nil: off.
	Key []byte
}

// enabled reports whether kvroute sets the salts.
func (s *SaltOptions) enabled() bool { return s.Key != nil }

// saltDomain separates the salts' digests from any other use of the key.
const saltDomain = "kvroute cache_salt\x00"

// salt returns tenant's salt: 32 hex digits of HMAC-SHA256 under Key.
func (s *SaltOptions) salt(tenant string) string {
	m := hmac.New(sha256.New, s.Key)
	m.Write([]byte(saltDomain))
	m.Write([]byte(tenant))
	var sum [sha256.Size]byte
	return hex.EncodeToString(m.Sum(sum[:0])[:16])
}

// salted reports whether requests of kind carry a cache_salt to engines.
func salted(kind oai.Kind) bool {
	return kind == oai.KindChat || kind == oai.KindCompletion || kind == oai.KindResponses
}

// setSalt replaces the request body's cache_salt members, if any, with
// the salt of the request's tenant under opts (apiKey is the client's
// bearer token, read before admit). The body must be a JSON object;
// else a 400.
func setSalt(ctx *fasthttp.RequestCtx, bufs *oai.Buffers, kind oai.Kind, apiKey []byte, opts *SaltOptions) *oai.Error {
	var user string
	if opts.From.User {
		parsed, err := bufs.Parse(kind, ctx.Request.Body())
		if err != nil {
			return asOAI(err)
		}
		user = parsed.User
	}
	value := strconv.Quote(opts.salt(tenantOf(ctx, user, apiKey, &opts.From)))
	body, err := editObject(ctx.Request.Body(), nil, member{name: fieldCacheSalt, value: []byte(value)})
	if err != nil {
		return oai.BadRequest("request body: "+err.Error(), "")
	}
	ctx.Request.SetBodyRaw(body)
	return nil
}

// fieldCacheSalt is vLLM's request field isolating its prefix cache.
const fieldCacheSalt = "cache_salt"
