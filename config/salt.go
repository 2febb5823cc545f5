package config

import "strings"

// CacheSalt has kvroute set each request's cache_salt itself, for the
// tenant the request is from: vLLM's prefix cache shares blocks only
// between requests with the same salt, so tenants cannot learn from
// cache hit timing what another tenant sent. A salt the caller sets is
// trusted as sent unless from is set: then it is replaced by a keyed
// digest of the tenant, which no caller can compute for another tenant.
type CacheSalt struct {
	// From says who a request's tenant is: header:<Name> (that header's
	// value, which a gateway in front must set: a caller choosing it
	// chooses its tenant), api_key (a digest of the API key the client
	// sent: the safe choice where each tenant has its own key) or user
	// (the request's user field, as trusted as the header). Requests
	// without one share the salt of the empty tenant. Empty: the caller's
	// cache_salt is forwarded as sent. Default empty.
	From string `mapstructure:"from"`
	// Key is the secret the salts are derived from (HMAC-SHA256 of the
	// tenant), at least 16 bytes; every instance of a cluster needs the
	// same one. Changing it changes every salt, which starts every
	// tenant's prefix cache afresh. Required with from. Default empty.
	Key string `mapstructure:"key"`
}

// MinCacheSaltKey is the shortest cache_salt.key accepted, in bytes.
const MinCacheSaltKey = 16

// Enabled reports whether kvroute sets the salts.
func (s *CacheSalt) Enabled() bool { return s.From != "" }

// TenantSourceHeader returns the header name of a header:<Name> tenant
// source (flow.tenant, cache_salt.from), and whether src is one.
func TenantSourceHeader(src string) (string, bool) {
	name, ok := strings.CutPrefix(src, TenantHeaderPrefix)
	if !ok {
		return "", false
	}
	return name, true
}

// checkTenantSource validates a tenant source in field.
func checkTenantSource(field, src string, bad func(field, format string, args ...any)) {
	switch name, isHeader := TenantSourceHeader(src); {
	case isHeader && !validHeaderName(name):
		bad(field, "%q is not a header name (want header:<Name>)", name)
	case isHeader, src == "", src == TenantAPIKey, src == TenantUser:
	default:
		bad(field, "unknown tenant source %q (want header:<Name>, %s or %s)", src, TenantAPIKey, TenantUser)
	}
}

// checkCacheSalt validates the cache_salt section.
func checkCacheSalt(s *CacheSalt, bad func(field, format string, args ...any)) {
	checkTenantSource("cache_salt.from", s.From, bad)
	switch {
	case s.From != "" && len(s.Key) < MinCacheSaltKey:
		bad("cache_salt.key", "must be a secret of at least %d bytes with cache_salt.from (the salts are derived from it), got %d", MinCacheSaltKey, len(s.Key))
	case s.From == "" && s.Key != "":
		bad("cache_salt.key", "is set but cache_salt.from is not: set from to have kvroute set the salts, or remove the key")
	}
}
