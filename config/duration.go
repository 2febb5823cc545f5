package config

import (
	"fmt"
	"math"
	"strconv"
	"time"

	"go.yaml.in/yaml/v3"
)

// parseDuration reads a duration written with its unit (30s, 250ms, 1m30s).
// A bare number is an error that says how to write it: whether 30 meant
// seconds or nanoseconds cannot be known. Zero needs no unit.
func parseDuration(s, tag string, n *yaml.Node) (time.Duration, error) {
	f, numeric := number(s, tag, n)
	if numeric {
		if f == 0 {
			return 0, nil
		}
		fix := s + "s"
		if _, err := time.ParseDuration(fix); err != nil {
			fix = strconv.FormatFloat(f, 'f', -1, 64) + "s"
		}
		if _, err := time.ParseDuration(fix); err != nil {
			return 0, fmt.Errorf("%s has no unit; write it with one (30s, 250ms, 1m30s, 1h)", s)
		}
		return 0, fmt.Errorf("%s has no unit; write %s", s, fix)
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not a duration; write a number with a unit (30s, 250ms, 1m30s, 1h)", s)
	}
	return d, nil
}

// number reports whether a value is a plain number, and its value: text
// that parses as one, or a YAML scalar that resolved to !!int or !!float.
func number(s, tag string, n *yaml.Node) (float64, bool) {
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		return f, true
	}
	if n != nil && (tag == "!!int" || tag == "!!float") {
		var f float64
		if n.Decode(&f) == nil && !math.IsNaN(f) {
			return f, true
		}
		return math.NaN(), true
	}
	return 0, false
}
