"""Two or more builds of one command, interleaved, side by side.

Runs each binary N times with the same arguments, alternating their order every round so a
change in the machine's load weighs on all alike, and prints each one's median wall time and
median CPU (user + system of the child and its threads, from getrusage).

Usage: python3 bench/ab.py N BINARY_A,BINARY_B[,...] ARGS...
e.g.   python3 bench/ab.py 21 /tmp/before,target/release/prefixscope profile trace.jsonl --format mooncake
"""
import resource
import statistics
import subprocess
import sys
import time

runs, binaries, args = int(sys.argv[1]), sys.argv[2].split(","), sys.argv[3:]
figures = {binary: ([], []) for binary in binaries}
for round in range(runs):
    for binary in binaries if round % 2 == 0 else binaries[::-1]:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.call([binary, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        figures[binary][0].append(wall)
        figures[binary][1].append(cpu)
for binary, (walls, cpus) in figures.items():
    print(f"{binary:40s} wall {statistics.median(walls) * 1000:6.1f} ms  "
          f"cpu {statistics.median(cpus) * 1000:6.1f} ms")
