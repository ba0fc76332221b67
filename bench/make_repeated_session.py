#!/usr/bin/env python3
"""Repeat a real recording back to back in one session, with new ids (what a benchmark that
replays one session against a server looks like): every copy opens as the first did, and the
analysis must keep each run its own conversation without scanning every run before it.
Usage: SRC OUT RECORDS"""
import json, sys

src, out, want = sys.argv[1], sys.argv[2], int(sys.argv[3])
recs = [json.loads(l) for l in open(src) if l.strip()]
t0 = min(r["t_start_ms"] for r in recs)
t1 = max(r["t_end_ms"] for r in recs)
# A second between copies: one session (llmp's gap is a minute).
span = t1 - t0 + 1000
n = 0
copy = 0
with open(out, "w") as f:
    while n < want:
        for r in recs:
            if n >= want:
                break
            n += 1
            x = dict(r)
            x["id"] = n
            for k in ("t_start_ms", "t_first_byte_ms", "t_end_ms"):
                if x.get(k) is not None:
                    x[k] = x[k] - t0 + copy * span + 1_800_000_000_000
            f.write(json.dumps(x, separators=(",", ":")) + "\n")
        copy += 1
print(n, "records")
