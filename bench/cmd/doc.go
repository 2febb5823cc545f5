// Package benchcmd holds kvroute's benchmarking commands: sim, demo and
// bench with its subcommands overhead, chaos, flood and attack. It builds
// them from the bench packages; main.go adds them to the command tree of
// package cli, which knows nothing of benchmarks.
package benchcmd
