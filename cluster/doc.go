// Package cluster lets several kvroute instances route as one. Each
// instance tells the others, through NATS, what it decides (placements and
// their lifecycle, its per-replica load, session bindings, stored response
// ids), and applies what they tell it to its own router: the peers'
// placements enter its Index as SourcePeer writes, their load joins its
// own in the replicas' fleet-wide counts.
//
// Messages are batches (wire.go): a version, the sender's id, a
// per-sender sequence and compact binary records. A receiver that sees a
// sequence gap, or a sender for the first time, asks that sender to resync:
// the sender replays its journal (journal.go), the records of its own
// recent placements, bindings and ids. A sender silent for three load
// intervals counts as gone and its load as zero. Without NATS, or without
// peers, an instance routes on its own view; it never fails a request for
// the cluster's sake.
//
// An instance embeds a NATS server (embed.go) and the instances form a NATS
// cluster among themselves over routes, or all connect to an existing NATS.
package cluster
