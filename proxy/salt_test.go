package proxy_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/kvtest"
)

const saltKey = "a secret of twenty-four b"

// wantSalt computes a tenant's salt as the documentation gives it:
// HMAC-SHA256 of the domain and the tenant under the key, its first 16
// bytes in hex.
func wantSalt(tenant string) string {
	m := hmac.New(sha256.New, []byte(saltKey))
	m.Write([]byte("kvroute cache_salt\x00" + tenant))
	return hex.EncodeToString(m.Sum(nil)[:16])
}

// sentSalts returns the cache_salt members of the last body r received,
// every copy, and whether it held the escaped spelling of the key.
func sentSalts(t *testing.T, r *kvtest.Replica) []string {
	t.Helper()
	_, body := r.LastRequest()
	if strings.Contains(string(body), `\u005f`) {
		t.Errorf("the escaped cache_salt key reached the replica: %s", body)
	}
	var salts []string
	dec := json.NewDecoder(strings.NewReader(string(body)))
	if _, err := dec.Token(); err != nil {
		t.Fatal(err)
	}
	for dec.More() {
		k, _ := dec.Token()
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			t.Fatal(err)
		}
		if k == "cache_salt" {
			var s string
			_ = json.Unmarshal(v, &s)
			salts = append(salts, s)
		}
	}
	return salts
}

// With cache_salt.from set, kvroute writes each request's salt from its
// tenant (here its API key) over whatever the caller sent: the same
// tenant's next request hits the prefix its first left, another tenant
// with the same prompt does not, and a caller who sends the victim's salt
// (twice, once under an escaped key) still gets its own.
func TestCacheSaltSetByTheGateway(t *testing.T) {
	for _, from := range []string{"api_key", "header:X-Tenant", "user"} {
		t.Run(from, func(t *testing.T) {
			reps := []*kvtest.Replica{kvtest.NewReplica(t, "r0", nil), kvtest.NewReplica(t, "r1", nil)}
			k := kvtest.Start(t, reps, func(c *config.Config) {
				c.Policy = "cache_aware"
				c.Auth.APIKeys = []string{"key-victim", "key-other"}
				c.CacheSalt = config.CacheSalt{From: from, Key: saltKey}
			})
			prompt := strings.Repeat("the same long shared system prompt of many words ", 40)
			send := func(tenant, extra string) (salts []string, route string) {
				t.Helper()
				body := `{"model":"m1","messages":[{"role":"user","content":"` + prompt + `"}]` + extra
				hdr := map[string]string{"Authorization": "Bearer key-" + tenant, "X-Tenant": tenant}
				if from == "user" {
					body += `,"user":"` + tenant + `"`
				}
				resp, _ := kvtest.Post(t, k.URL+"/v1/chat/completions", body+"}", hdr) //nolint:bodyclose // Post reads and closes the body
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("%s: status %d", tenant, resp.StatusCode)
				}
				rep := reps[0]
				if resp.Header.Get("X-Kvroute-Backend") == "r1" {
					rep = reps[1]
				}
				return sentSalts(t, rep), resp.Header.Get("X-Kvroute-Route")
			}
			tenant := func(name string) string {
				switch from {
				case "api_key":
					sum := sha256.Sum256([]byte("key-" + name))
					return "key:" + hex.EncodeToString(sum[:8])
				}
				return name
			}
			victim, other := wantSalt(tenant("victim")), wantSalt(tenant("other"))
			if salts, _ := send("victim", `,"cache_salt":"chosen by the caller"`); len(salts) != 1 || salts[0] != victim {
				t.Fatalf("victim's first request carried salts %q, want [%s]", salts, victim)
			}
			if salts, route := send("victim", ""); len(salts) != 1 || salts[0] != victim || !strings.HasPrefix(route, "cache_hit") {
				t.Errorf("victim's second request: salts %q, route %q; want its salt and a cache hit", salts, route)
			}
			if salts, route := send("other", ""); len(salts) != 1 || salts[0] != other || strings.HasPrefix(route, "cache_hit") {
				t.Errorf("other tenant: salts %q, route %q; want its own salt and no hit", salts, route)
			}
			stolen := `,"cache_salt":"` + victim + `","cache\u005fsalt":"` + victim + `"`
			if salts, route := send("other", stolen); len(salts) != 1 || salts[0] != other || !strings.HasPrefix(route, "cache_hit") {
				t.Errorf("other tenant sending the victim's salt: salts %q, route %q; want its own salt (and its own earlier prefix)", salts, route)
			}
		})
	}
}

// Without cache_salt.from the caller's salt is forwarded as sent.
func TestCacheSaltAsSent(t *testing.T) {
	r0 := kvtest.NewReplica(t, "r0", nil)
	k := kvtest.Start(t, []*kvtest.Replica{r0})
	resp, _ := kvtest.Post(t, k.URL+"/v1/chat/completions", `{"model":"m1","messages":[{"role":"user","content":"hi"}],"cache_salt":"mine"}`, nil) //nolint:bodyclose // Post reads and closes the body
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if salts := sentSalts(t, r0); len(salts) != 1 || salts[0] != "mine" {
		t.Errorf("salts %q, want the caller's", salts)
	}
}
