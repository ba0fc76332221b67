#!/usr/bin/env python3
"""Replicate a real recording N times into one larger recording (for size and latency bars).

Origin: ../shared/tools/make_big_recording.py, kept here so a clone runs the benchmarks alone.

Each copy is shifted past the previous one by its duration plus two minutes (so copies are
separate sessions) and renumbered; every 7th copy is interleaved with the one before (its times
overlap), so conversations of different copies run at once. Usage: SRC OUT RECORDS [--one-session]

--one-session: the copies back to back, a second apart, none interleaved: one session repeated
with new ids (a benchmark replaying one session), every run opening as the first did."""
import json, sys

src, out, want = sys.argv[1], sys.argv[2], int(sys.argv[3])
one_session = sys.argv[4:] == ["--one-session"]
recs = [json.loads(l) for l in open(src) if l.strip()]
t0 = min(r["t_start_ms"] for r in recs)
t1 = max((r.get("t_end_ms") or r["t_start_ms"]) for r in recs)
span = t1 - t0 + (1_000 if one_session else 120_000)
n = 0
copy = 0
with open(out, "w") as f:
    while n < want:
        interleaved = copy % 7 == 6 and not one_session
        base = copy * span - (span // 2 if interleaved else 0)
        for r in recs:
            if n >= want:
                break
            n += 1
            x = dict(r)
            x["id"] = n
            x["conn"] = (r.get("conn") or 0) + copy * 1000
            for k in ("t_start_ms", "t_first_byte_ms", "t_end_ms"):
                if x.get(k) is not None:
                    x[k] = x[k] - t0 + base + 1_800_000_000_000
            ua = ((x.get("request") or {}).get("headers") or {})
            if "user-agent" in ua and interleaved:
                x["request"] = dict(x["request"])
                x["request"]["headers"] = dict(ua, **{"user-agent": ua["user-agent"] + f" copy{copy}"})
            f.write(json.dumps(x, separators=(",", ":"), sort_keys=True) + "\n")
        copy += 1
print(n, "records")
