#!/usr/bin/env python3
"""Upper bound on the prefix-cache hit rate of the Mooncake trace with finite
caches: replay the first N requests in order over R replicas, each an LRU
cache of 512-token blocks (prompt blocks only, as the simulator caches them),
and route each request either round-robin or to the replica holding its
longest cached prefix among those whose request count stays within 1.1x the
mean. Token-weighted, like the README of the trace.

    python3 bench/scripts/finite_cache_bound.py [N] [kv_tokens_per_replica] [trace]

The trace (default conversation_trace.jsonl in the working directory) is the
Mooncake FAST'25 conversation trace, which is not part of this repository:
    curl -LO https://github.com/kvcache-ai/Mooncake/raw/3b5a594133958449a1feaf1c9e0fc1b553e34a28/FAST25-release/traces/conversation_trace.jsonl
"""
import collections
import json
import os
import sys

N = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
KV = int(sys.argv[2]) if len(sys.argv) > 2 else 400_000
TRACE = sys.argv[3] if len(sys.argv) > 3 else "conversation_trace.jsonl"
R = 8

if not os.path.exists(TRACE):
    sys.exit(f"trace {TRACE}: no such file; download the Mooncake FAST'25 conversation trace and pass its path:\n"
             "  curl -LO https://github.com/kvcache-ai/Mooncake/raw/3b5a594133958449a1feaf1c9e0fc1b553e34a28/FAST25-release/traces/conversation_trace.jsonl\n"
             "(from github.com/kvcache-ai/Mooncake, FAST25-release/traces)")

with open(TRACE) as f:
    reqs = [json.loads(line) for _, line in zip(range(N), f)]


def run(policy, cap_blocks):
    caches = [collections.OrderedDict() for _ in range(R)]
    load = [0] * R
    hit = tot = rr = 0
    for q in reqs:
        blocks, n = q["hash_ids"], q["input_length"]

        def lead(c):
            k = 0
            for b in blocks:
                if b not in c:
                    break
                k += 1
            return k

        m = [lead(c) for c in caches]
        if policy == "round_robin":
            r, rr = rr % R, rr + 1
        else:
            mean = (sum(load) + 1) / R
            ok = [i for i in range(R) if load[i] + 1 <= 1.1 * mean + 1] or list(range(R))
            r = max(ok, key=lambda i: (m[i], -load[i]))
        load[r] += 1
        hit += min(m[r] * 512, n)
        tot += n
        c = caches[r]
        for b in blocks:
            c[b] = True
            c.move_to_end(b)
        while cap_blocks and len(c) > cap_blocks:
            c.popitem(last=False)
    return hit / tot


for label, cap in (("infinite", 0), (f"{KV} tokens", KV // 512)):
    print(f"caches {label:>14}: round_robin {run('round_robin', cap):.3f}  "
          f"longest-prefix within 1.1x load {run('lpm', cap):.3f}")
