// Command kvroute is a KV-cache-aware load balancer for fleets of vLLM and
// SGLang replicas speaking the OpenAI API.
package main

import (
	benchcmd "github.com/kvroute/kvroute/bench/cmd"
	"github.com/kvroute/kvroute/cli"
)

func main() { cli.Execute(benchcmd.Commands()...) }
