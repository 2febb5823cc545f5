package config

import "testing"

// expose_route_reason is off unless the file turns it on.
func TestExposeRouteReason(t *testing.T) {
	c, err := Load(writeFile(t, minimal), nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.ExposeRouteReason || Default().ExposeRouteReason {
		t.Fatal("expose_route_reason is on by default")
	}
	if c, err = Load(writeFile(t, "expose_route_reason: true\n"+minimal), nil); err != nil || !c.ExposeRouteReason {
		t.Fatalf("expose_route_reason: true: %v, %v", c.ExposeRouteReason, err)
	}
}
