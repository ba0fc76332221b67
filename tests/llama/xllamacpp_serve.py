# Starts the real llama.cpp server code (PyPI wheel xllamacpp) on 127.0.0.1.
# Usage: python3 xllamacpp_serve.py MODEL.gguf PORT [SLOTS]
# Origin: ../shared/tools/llama-server/xllamacpp_serve.py, with the slot count made a parameter.
import sys, signal, threading
import xllamacpp as xlc

p = xlc.CommonParams()
p.model.path = sys.argv[1]
p.hostnames = ["127.0.0.1"] if isinstance(p.hostnames, list) else "127.0.0.1"
p.port = int(sys.argv[2])
if len(sys.argv) > 3:
    p.n_parallel = int(sys.argv[3])
p.n_ctx = 2048 * max(1, p.n_parallel if len(sys.argv) > 3 else 1)
p.endpoint_metrics = True
p.endpoint_slots = True
s = xlc.Server(p)
print("listening", s.listening_address, flush=True)
ev = threading.Event()
signal.signal(signal.SIGTERM, lambda *a: ev.set())
signal.signal(signal.SIGINT, lambda *a: ev.set())
ev.wait()
