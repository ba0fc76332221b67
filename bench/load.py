#!/usr/bin/env python3
"""Heavy and hostile traffic for the memory rows of BENCHMARKS.md ("Memory under load").

  load.py stub PORT                 an OpenAI-style server answering 200 with usage, at once
  load.py agents PORT N SIZE        N agent requests through a proxy: conversations of 20 turns,
                                    8 at a time, whose history grows to about SIZE bytes
  load.py random N OUT              N random high-variety records (a recording, no server needed)
  load.py post PORT FILE N          the first N request bodies of a recording, 8 at a time
  load.py big PORT N MIB            N requests of MIB MiB of body each, all at once"""
import concurrent.futures as cf
import http.client
import itertools
import json
import random
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

WORDS = ["alpha", "beta", "gamma", "delta", "file", "src", "main", "fn", "let", "mut", "read", "tool"]


def words(rnd, k):
    return " ".join(rnd.choice(WORDS) + str(rnd.randrange(100000)) for _ in range(k))


def stub(port):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):
            self.send_response(404)
            self.send_header("content-length", "0")
            self.end_headers()

        def do_POST(self):
            left = int(self.headers.get("content-length") or 0)
            n = left
            while left > 0:
                got = self.rfile.read(min(left, 1 << 20))
                if not got:
                    break
                left -= len(got)
            body = json.dumps({"id": "x", "object": "chat.completion", "model": "m",
                               "choices": [{"index": 0, "message": {"role": "assistant", "content": "done, ok."},
                                            "finish_reason": "stop"}],
                               "usage": {"prompt_tokens": n // 4, "completion_tokens": 3}}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


def agents(port, n, size, turns=20):
    def conversation(c):
        rnd = random.Random(c)
        h = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        messages = [{"role": "system", "content": "You are agent %d. " % c + words(rnd, size // 12)}]
        step = size // 2 // turns // 7
        for _ in range(turns):
            messages.append({"role": "user", "content": words(rnd, step)})
            h.request("POST", "/v1/chat/completions", json.dumps({"model": "m", "messages": messages}),
                      {"content-type": "application/json"})
            messages.append(json.loads(h.getresponse().read())["choices"][0]["message"])

    with cf.ThreadPoolExecutor(8) as pool:
        list(pool.map(conversation, range(max(1, n // turns))))


def random_records(n, out):
    rnd = random.Random(7)
    systems = [words(rnd, rnd.randrange(5, 400)) for _ in range(2000)]
    t = 1_800_000_000_000
    with open(out, "w") as f:
        for i in range(1, n + 1):
            t += rnd.randrange(0, 400)
            messages = [{"role": "system", "content": rnd.choice(systems)}]
            for j in range(rnd.randrange(1, 12)):
                messages.append({"role": "user" if j % 2 == 0 else "assistant", "content": words(rnd, rnd.randrange(1, 200))})
            if messages[-1]["role"] == "assistant":
                messages.append({"role": "user", "content": words(rnd, 5)})
            body = {"model": "m%d" % rnd.randrange(20), "messages": messages}
            prompt = len(json.dumps(body)) // 4
            cached = rnd.randrange(0, prompt)
            reply = {"choices": [{"index": 0, "message": {"role": "assistant", "content": words(rnd, 10)}, "finish_reason": "stop"}],
                     "usage": {"prompt_tokens": prompt, "completion_tokens": 10},
                     "timings": {"prompt_n": prompt - cached, "cache_n": cached, "prompt_ms": 10.0, "predicted_n": 10, "predicted_ms": 5.0}}
            record = {"v": 1, "id": i, "conn": rnd.randrange(1, 500), "t_start_ms": t, "t_first_byte_ms": t + 100, "t_end_ms": t + 300,
                      "request": {"method": "POST", "path": "/v1/chat/completions",
                                  "headers": {"content-type": "application/json", "user-agent": "client%d" % rnd.randrange(50)},
                                  "body_bytes": len(json.dumps(body)), "truncated": False, "body": body},
                      "response": {"status": 200, "headers": {"content-type": "application/json"}, "body_bytes": 100,
                                   "truncated": False, "body": reply}}
            f.write(json.dumps(record, separators=(",", ":")) + "\n")


def post(port, path, n):
    with open(path) as f:
        bodies = [json.dumps(json.loads(line)["request"]["body"]) for line in itertools.islice(f, n)]

    def send(chunk):
        h = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        for body in chunk:
            h.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
            h.getresponse().read()

    with cf.ThreadPoolExecutor(8) as pool:
        list(pool.map(send, [bodies[i::8] for i in range(8)]))


def big(port, n, mib):
    body = b'{"model":"m","messages":[{"role":"user","content":"' + b"x" * (mib << 20) + b'"}]}'
    statuses = []

    def send():
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                  b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body))
        s.sendall(body)
        got = b""
        while chunk := s.recv(65536):
            got += chunk
        statuses.append(got.split(b"\r\n")[0].decode())

    threads = [threading.Thread(target=send) for _ in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(sorted(set(statuses)), len(statuses))


if __name__ == "__main__":
    command, args = sys.argv[1], sys.argv[2:]
    if command == "stub":
        stub(int(args[0]))
    elif command == "agents":
        agents(int(args[0]), int(args[1]), int(args[2]))
    elif command == "random":
        random_records(int(args[0]), args[1])
    elif command == "post":
        post(int(args[0]), args[1], int(args[2]))
    elif command == "big":
        big(int(args[0]), int(args[1]), int(args[2]))
    else:
        sys.exit(__doc__)
