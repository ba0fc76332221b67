# Starts the real llama.cpp server code (PyPI wheel xllamacpp) on 127.0.0.1.
# Usage: python3 xllamacpp_serve.py MODEL.gguf PORT [SLOTS [CTX_PER_SLOT]]
#   SLOTS         llama-server's -np (default 1)
#   CTX_PER_SLOT  tokens per slot (default 2048). Above the model's trained context (8192 for
#                 SmolLM2) llama-server caps the slot at it; YaRN scaling from 8192 lifts the cap
#                 (llama.cpp then takes n_ctx_train as 8192 / rope_freq_scale).
# Environment (all optional; unset keeps llama-server's defaults):
#   PREFIXSCOPE_LLAMA_N_PREDICT  tokens generated for a request that sets no max_tokens
#   PREFIXSCOPE_LLAMA_TEMP       sampling temperature for a request that sets none
#   PREFIXSCOPE_LLAMA_GRAMMAR    a GBNF grammar for a request that sets none (and no tools that
#                                bring one): SmolLM2 under an agent's long system prompt rarely
#                                stops by itself, and a harness that meets max_tokens retries
#   PREFIXSCOPE_LLAMA_THREADS    CPU threads; 1 is several times faster than 2 when other work
#                                shares the two cores (llama.cpp's threads wait on each other)
#   PREFIXSCOPE_LLAMA_CACHE_RAM  the host-memory prompt cache in MiB (--cache-ram; 0 turns it off)
# Origin: ../shared/tools/llama-server/xllamacpp_serve.py, with the slot count made a parameter.
import os, sys, signal, threading
import xllamacpp as xlc

TRAINED_CTX = 8192

p = xlc.CommonParams()
p.model.path = sys.argv[1]
p.hostnames = ["127.0.0.1"] if isinstance(p.hostnames, list) else "127.0.0.1"
p.port = int(sys.argv[2])
if len(sys.argv) > 3:
    p.n_parallel = int(sys.argv[3])
ctx_per_slot = int(sys.argv[4]) if len(sys.argv) > 4 else 2048
p.n_ctx = ctx_per_slot * max(1, p.n_parallel if len(sys.argv) > 3 else 1)
if ctx_per_slot > TRAINED_CTX:
    p.rope_scaling_type = type(p.rope_scaling_type).LLAMA_ROPE_SCALING_TYPE_YARN
    p.yarn_orig_ctx = TRAINED_CTX
    p.rope_freq_scale = TRAINED_CTX / ctx_per_slot
if os.environ.get("PREFIXSCOPE_LLAMA_N_PREDICT"):
    p.n_predict = int(os.environ["PREFIXSCOPE_LLAMA_N_PREDICT"])
if os.environ.get("PREFIXSCOPE_LLAMA_TEMP"):
    p.sampling.temp = float(os.environ["PREFIXSCOPE_LLAMA_TEMP"])
if os.environ.get("PREFIXSCOPE_LLAMA_GRAMMAR"):
    p.sampling.grammar = xlc.CommonGrammar(
        xlc.common_grammar_type.COMMON_GRAMMAR_TYPE_USER, os.environ["PREFIXSCOPE_LLAMA_GRAMMAR"]
    )
if os.environ.get("PREFIXSCOPE_LLAMA_THREADS"):
    p.cpuparams.n_threads = p.cpuparams_batch.n_threads = int(os.environ["PREFIXSCOPE_LLAMA_THREADS"])
if os.environ.get("PREFIXSCOPE_LLAMA_CACHE_RAM"):
    p.cache_ram_mib = int(os.environ["PREFIXSCOPE_LLAMA_CACHE_RAM"])
p.endpoint_metrics = True
p.endpoint_slots = True
s = xlc.Server(p)
print("listening", s.listening_address, flush=True)
ev = threading.Event()
signal.signal(signal.SIGTERM, lambda *a: ev.set())
signal.signal(signal.SIGINT, lambda *a: ev.set())
ev.wait()
