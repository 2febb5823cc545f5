package runner

import (
	"testing"

	"github.com/kvroute/kvroute/internal/kvtest"
)

// serveArg makes the test binary serve kvroute, standing in for `kvroute
// serve` (Options.KvrouteCommand): TestMain runs it before any test when
// os.Args[1] is it.
const serveArg = "runner-test-serve-kvroute"

func TestMain(m *testing.M) { kvtest.Main(m, serveArg) }
