package benchcmd

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/kvroute/kvroute/bench/flood"
	"github.com/kvroute/kvroute/bench/load"
)

// newFloodCmd is `kvroute bench flood`: unique prompts, or the whole
// Mooncake trace, through the routing path, checking memory bounds.
func newFloodCmd() *cobra.Command {
	var (
		bytes, tree, caches int64
		prompt              int
		trace               string
	)
	cmd := &cobra.Command{
		Use:   "flood",
		Short: "Push unique prompts (or the whole Mooncake trace) through the routing path and check memory bounds",
		Long: `flood drives kvroute's routing path (parse, tokenize, match, score, record)
without a network: by default --bytes of unique prompts; with --trace, every
request of the Mooncake conversation trace in order. It reports whether the
prefix tree and the token caches stayed within their bounds, the tree's bytes
per stored token, and the resident memory before and at its peak.

The trace is public and not part of kvroute; download it once:
  curl -LO ` + load.MooncakeTraceURL,
		Example: `  kvroute bench flood
  kvroute bench flood --trace conversation_trace.jsonl`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o := flood.Options{Bytes: bytes, PromptBytes: prompt, TreeMaxBytes: tree, CacheBytes: caches}
			var rep *flood.Report
			var err error
			if trace != "" {
				rep, err = flood.RunTrace(trace, o)
			} else {
				rep, err = flood.Run(o)
			}
			if err != nil {
				return err
			}
			out, _ := json.MarshalIndent(rep, "", "  ")
			if _, err := fmt.Fprintln(cmd.OutOrStdout(), string(out)); err != nil {
				return err
			}
			if !rep.WithinBounds {
				return fmt.Errorf("bounds broken: tree %d of %d bytes, caches %d of %d bytes", rep.TreeBytesMax, rep.TreeBound, rep.CacheBytesMax, rep.CacheBound)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.Int64Var(&bytes, "bytes", 1<<30, "prompt bytes to send (unique prompts)")
	f.IntVar(&prompt, "prompt-bytes", 64<<10, "bytes per unique prompt")
	f.Int64Var(&tree, "tree-max-bytes", 256<<20, "index.tree_max_bytes")
	f.Int64Var(&caches, "cache-bytes", 64<<20, "tokenizer.cache_bytes")
	f.StringVar(&trace, "trace", "", "replay this Mooncake conversation trace (conversation_trace.jsonl) instead of unique prompts")
	return cmd
}
