package config

import (
	"errors"
	"math"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
)

// The decode hooks, run before mapstructure sets each value, refuse what a
// weakly typed decoder would otherwise read silently and differently.

var (
	errEmpty       = errors.New("is empty")
	errNotDuration = errors.New("is not a duration")
)

// noUnitError is a duration given as a bare number (its value): whether 30
// meant seconds or nanoseconds cannot be known.
type noUnitError float64

func (noUnitError) Error() string { return "has no unit" }

// emptyItemError is an empty item (its index) of a comma-separated list.
type emptyItemError int

func (emptyItemError) Error() string { return "is empty" }

// strictHook refuses the empty string (an empty variable or flag) for a
// number or a boolean, which would decode as zero; a fraction or a number
// out of range for a whole number, which would be truncated; and a boolean
// for a number or a number for a boolean.
func strictHook(from, to reflect.Value) (any, error) {
	if from.Kind() == reflect.String && from.String() == "" && (isNumber(to) || to.Kind() == reflect.Bool) {
		return nil, errEmpty
	}
	bad := isNumber(to) && from.Kind() == reflect.Bool || to.Kind() == reflect.Bool && isNumber(from)
	if to.CanInt() && from.CanFloat() {
		f := from.Float()
		bad = f != math.Trunc(f) || f < math.MinInt64 || f >= math.MaxInt64
	} else if to.CanInt() && from.CanUint() {
		bad = from.Uint() > math.MaxInt64
	}
	if bad {
		return nil, &mapstructure.ParseError{Expected: to, Value: from.Interface(), Err: errors.New("would change its meaning")}
	}
	return from.Interface(), nil
}

func isNumber(v reflect.Value) bool { return v.CanInt() || v.CanUint() || v.CanFloat() }

// durationHook decodes a duration written with its unit (30s, 250ms,
// 1m30s) and refuses a bare number, whether YAML read it as a number or as
// a string ("30"). Zero needs no unit.
func durationHook(from, to reflect.Value) (any, error) {
	if to.Type() != durationType || from.Type() == durationType {
		return from.Interface(), nil
	}
	var f float64
	switch {
	case from.Kind() == reflect.String && from.String() == "":
		return nil, errEmpty
	case from.Kind() == reflect.String:
		x, err := strconv.ParseFloat(from.String(), 64)
		if err != nil {
			d, err := time.ParseDuration(from.String())
			if err != nil {
				return nil, errNotDuration
			}
			return d, nil
		}
		f = x
	case from.CanInt():
		f = float64(from.Int())
	case from.CanUint():
		f = float64(from.Uint())
	case from.CanFloat():
		f = from.Float()
	default:
		return nil, errNotDuration
	}
	if f == 0 {
		return time.Duration(0), nil
	}
	return nil, noUnitError(f)
}

// noUnit says how to write the bare number raw (whose value is f) as a
// duration: 30 → 30s, 0x10 → 16s.
func noUnit(raw string, f float64) string {
	fix := raw + "s"
	if _, err := time.ParseDuration(fix); err != nil {
		fix = strconv.FormatFloat(f, 'f', -1, 64) + "s"
	}
	if _, err := time.ParseDuration(fix); err != nil {
		return raw + " has no unit; write it with one (30s, 250ms, 1m30s, 1h)"
	}
	return raw + " has no unit; write " + fix
}

// listHook splits a list given as text (a variable or a flag) at commas,
// trimming spaces; the empty string is the empty list.
func listHook(from, to reflect.Value) (any, error) {
	if from.Kind() != reflect.String || to.Kind() != reflect.Slice {
		return from.Interface(), nil
	}
	if from.String() == "" {
		return []string{}, nil
	}
	items := strings.Split(from.String(), ",")
	for i := range items {
		if items[i] = strings.TrimSpace(items[i]); items[i] == "" {
			return nil, emptyItemError(i)
		}
	}
	return items, nil
}

// typeName names a leaf's type for messages.
func typeName(t reflect.Type) string {
	switch v := reflect.Zero(t); {
	case t == durationType:
		return "a duration (30s, 250ms)"
	case t.Kind() == reflect.String:
		return "a string"
	case t.Kind() == reflect.Bool:
		return "true or false"
	case v.CanInt() || v.CanUint():
		return "a whole number"
	case v.CanFloat():
		return "a number"
	case t.Kind() == reflect.Slice:
		return "a list of " + strings.TrimPrefix(typeName(t.Elem()), "a ") + "s"
	}
	return t.String()
}
