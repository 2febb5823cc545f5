package backends

import (
	"strings"
	"testing"

	"go.uber.org/zap"
)

// TestRoles checks what a fleet accepts as roles and bootstrap ports and
// what the replica's accessors report, across a reload that changes them.
func TestRoles(t *testing.T) {
	cases := []struct {
		name             string
		role             Role
		port             int
		err              string
		want             Role
		prefills, decods bool
		wantPort         int
	}{
		{name: "unset is both", want: RoleBoth, prefills: true, decods: true, wantPort: DefaultBootstrapPort},
		{name: "both", role: RoleBoth, want: RoleBoth, prefills: true, decods: true, wantPort: DefaultBootstrapPort},
		{name: "prefill", role: RolePrefill, port: 9001, want: RolePrefill, prefills: true, wantPort: 9001},
		{name: "decode", role: RoleDecode, want: RoleDecode, decods: true, wantPort: DefaultBootstrapPort},
		{name: "unknown", role: "prefil", err: `replica "a": unknown role "prefil"`},
		{name: "port out of range", role: RolePrefill, port: 65536, err: `replica "a": bootstrap port 65536 out of range`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			specs := []Spec{{Name: "a", URL: "http://127.0.0.1:20310", Engine: EngineSGLang, Role: tc.role, BootstrapPort: tc.port}}
			f, err := NewFleet(specs, Options{}, zap.NewNop())
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("NewFleet: err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			r := f.Replicas()[0]
			host, port := r.Bootstrap()
			if r.Role() != tc.want || r.Prefills() != tc.prefills || r.Decodes() != tc.decods || host != "127.0.0.1" || port != tc.wantPort {
				t.Errorf("role %q prefills %v decodes %v bootstrap %s:%d; want %q %v %v 127.0.0.1:%d",
					r.Role(), r.Prefills(), r.Decodes(), host, port, tc.want, tc.prefills, tc.decods, tc.wantPort)
			}
			specs[0].Role = RoleDecode
			if _, _, err := f.Update(specs); err != nil {
				t.Fatal(err)
			}
			if f.Replicas()[0] != r || r.Role() != RoleDecode || r.Prefills() {
				t.Errorf("after a reload to decode: same replica %v, role %q", f.Replicas()[0] == r, r.Role())
			}
		})
	}
}
