package config

import (
	"flag"
	"os"
	"testing"
)

// fuzzMinimizeTime bounds how long the fuzzer minimizes each input, unless
// -fuzzminimizetime is given. Go minimizes every input that finds new
// coverage (by default for up to 60s, trying a number of candidates that
// grows with the square of the input's length) and counts no executions
// meanwhile, so a fresh FuzzLoad run sat at 0 execs/s for most of its
// time. A failing input is still written, minimized for this long.
const fuzzMinimizeTime = "1s"

func TestMain(m *testing.M) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.fuzzminimizetime" })
	if !set {
		if err := flag.Set("test.fuzzminimizetime", fuzzMinimizeTime); err != nil {
			panic(err)
		}
	}
	os.Exit(m.Run())
}
