package attack

import (
	"context"
	"errors"
	"fmt"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
)

// NewCommand is `kvroute bench attack`.
func NewCommand() *cobra.Command {
	o := Options{Out: filepath.Join("bench-out", "attack"), Sizes: DefaultSizes()}
	cmd := &cobra.Command{
		Use:   "attack",
		Short: "Run hostile clients and a hostile upstream against a kvroute process and report what held",
		Long: `attack starts, for each attack, a kvroute process ("kvroute serve" with a
generated configuration) in front of hostile upstreams of its own (raw TCP
vLLM look-alikes), attacks it with a hostile client (raw TCP) and checks
that kvroute held:

  body-flood          connections declaring an 8 MiB body and sending 1 byte
  partial-bodies      connections sending 2 MiB of a declared 8 MiB body, then waiting
  unread-answers      clients that never read their 10 MB answers
  idle-conns          connections with an unfinished request head (cost per connection)
  pool-full           streams held open past both replicas' pools, normal requests sent meanwhile
  slow-reader         streams whose clients stop reading (timeouts.client_write)
  session-ids         session IDs of 16 KB
  user-fields         "user" fields of 1 MB
  stray-bytes         a replica sending a second response after its answer
  absolute-form-host  POST http://evil.example:9999/... (the Host the replica sees)
  connect             CONNECT
  no-content-type     a body without Content-Type
  header-name-space   a header name with a space
  chunked-trailers    a chunked request with a trailer
  upstream-101        a replica answering 101 Switching Protocols
  bare-lf-head        a replica answering with LF-only line endings
  conn-cap            connections past limits.max_connections
  idle-keepalive      a kept-alive connection left idle (timeouts.client_idle)

Resident memory (VmRSS, VmHWM) is read from /proc/<pid>/status (Linux)
and compared with the worst-case formula of docs/memory.md for the run's
limits. It prints the table (attack, held, figure), writes results.md and
each attack's kvroute configuration and log into --out, and exits non-zero
when an attack did not hold.`,
		Example: `  kvroute bench attack --out bench-out/attack
  kvroute bench attack --attacks body-flood,unread-answers`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.Notes = cmd.ErrOrStderr()
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			rep, err := Run(ctx, o)
			if rep == nil {
				return err
			}
			if _, perr := fmt.Fprint(cmd.OutOrStdout(), "\n"+rep.Markdown()); err == nil {
				err = perr
			}
			if o.Out != "" {
				_, _ = fmt.Fprintf(cmd.ErrOrStderr(), "\nwrote %s in %s\n", FileMarkdown, o.Out)
			}
			if errors.Is(err, context.Canceled) {
				return errors.New("interrupted")
			}
			if err != nil {
				return err
			}
			if !rep.Held() {
				var failed []string
				for _, r := range rep.Results {
					if !r.Held {
						failed = append(failed, r.Attack)
					}
				}
				return fmt.Errorf("attacks not held: %s", strings.Join(failed, ", "))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Out, "out", o.Out, "directory for results.md and each attack's kvroute configuration and log")
	f.StringSliceVar(&o.Attacks, "attacks", nil, "attacks to run, comma-separated (default all): "+strings.Join(Names(), ", "))
	f.IntVar(&o.Sizes.BodyFloodConns, "body-flood-conns", o.Sizes.BodyFloodConns, "body-flood: connections")
	f.IntVar(&o.Sizes.PartialBodies, "partial-bodies", o.Sizes.PartialBodies, "partial-bodies: connections")
	f.IntVar(&o.Sizes.UnreadAnswers, "unread-answers", o.Sizes.UnreadAnswers, "unread-answers: clients")
	f.IntVar(&o.Sizes.PoolHolders, "pool-holders", o.Sizes.PoolHolders, "pool-full: streams held open")
	f.IntVar(&o.Sizes.SessionIDs, "session-ids", o.Sizes.SessionIDs, "session-ids: IDs of 16 KB")
	f.IntVar(&o.Sizes.UserFields, "user-fields", o.Sizes.UserFields, "user-fields: fields of 1 MB")
	f.IntVar(&o.Sizes.IdleConns, "idle-conns", o.Sizes.IdleConns, "idle-conns: connections (below limits.max_connections 300)")
	return cmd
}
