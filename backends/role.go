package backends

import "fmt"

// Role is the part a replica plays in a disaggregated fleet: the engine
// that computes a prompt's KV cache (prefill), the one that generates from
// it (decode), or both, as an ordinary replica does.
type Role string

// Roles. The zero value is RoleBoth.
const (
	RoleBoth    Role = "both"
	RolePrefill Role = "prefill"
	RoleDecode  Role = "decode"
)

// DefaultBootstrapPort is the port of an SGLang prefill engine's bootstrap
// server when its spec names none (SGLang's --disaggregation-bootstrap-port
// default).
const DefaultBootstrapPort = 8998

// checkRole validates a spec's role and bootstrap port.
func checkRole(s Spec) error {
	switch s.Role {
	case "", RoleBoth, RolePrefill, RoleDecode:
	default:
		return fmt.Errorf("unknown role %q (want %q, %q or %q)", s.Role, RolePrefill, RoleDecode, RoleBoth)
	}
	if s.BootstrapPort < 0 || s.BootstrapPort > 65535 {
		return fmt.Errorf("bootstrap port %d out of range (1-65535, 0 for %d)", s.BootstrapPort, DefaultBootstrapPort)
	}
	return nil
}

// Role returns the replica's role; RoleBoth when its spec sets none. Like
// the weight, it may change with [Fleet.Update].
func (r *Replica) Role() Role {
	if role := r.spec.Load().spec.Role; role != "" {
		return role
	}
	return RoleBoth
}

// Prefills reports whether the replica may serve the prefill side of a
// disaggregated request (a prefill or both replica).
func (r *Replica) Prefills() bool { return r.Role() != RoleDecode }

// Decodes reports whether the replica may serve the decode side of a
// disaggregated request, or a whole request (a decode or both replica).
func (r *Replica) Decodes() bool { return r.Role() != RolePrefill }

// Bootstrap returns the host and port of the replica's SGLang bootstrap
// server, which a decode engine reaches to pull the KV cache of a prompt
// the replica prefilled: the URL's host and the spec's BootstrapPort
// (DefaultBootstrapPort when 0).
func (r *Replica) Bootstrap() (host string, port int) {
	st := r.spec.Load()
	port = st.spec.BootstrapPort
	if port == 0 {
		port = DefaultBootstrapPort
	}
	return r.target.host, port
}
