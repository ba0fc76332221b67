#!/usr/bin/env python3
"""Convert the VCR cassettes under raw/ into prefixscope (llmp format v1) recordings.

    python3 convert.py [DIR]      # writes DIR/openai.jsonl, anthropic.jsonl, records_index.json
                                  # from DIR/raw (DIR: this folder, or ../hosted2)

No network. Needs PyYAML (python3-yaml). Reads raw/manifest.json for the source commits.

Rules (see README.md):
  * only POST https://api.openai.com/v1/chat/completions and POST https://api.anthropic.com/v1/messages
    (count_tokens, files, batches and every other host are dropped);
  * request and response must both be JSON (streamed responses are merged into the
    non-streamed shape first); otherwise the exchange is skipped;
  * OpenAI streams are kept only when a final `usage` object is present in the stream;
    Anthropic streams always carry usage (message_start + message_delta) and are merged;
  * request headers kept: host, user-agent, anthropic-version, anthropic-beta, content-type;
    response headers kept: content-type. Nothing else (no auth, no cookies, no org ids);
  * path is written without query (pydantic-ai recorded `/v1/messages?beta=true`);
  * times: from the response `Date` header when the cassette has one (1 s resolution;
    t_first_byte_ms = t_end_ms = Date, t_start_ms = Date - openai-processing-ms when that
    header exists, else Date - 1, but never before the previous record's t_end); else synthetic (1 s apart within a cassette, 1 h between
    cassettes, starting at the next UTC midnight after the last real Date in the file, or
    2025-01-01T00:00:00Z when the file has none); t_first_byte = start + 400, t_end = start + 800;
  * Date-bearing cassettes are split into recording sessions (gap > 120 s or time going
    backwards) and all sessions/cassettes of a file are ordered by time, so ids follow time;
  * ids start at 1 in each file; conn = one number per session/cassette block.
"""
import email.utils
import glob
import gzip
import json
import os
import sys
import zlib
from urllib.parse import urlsplit

import yaml

try:
    from yaml import CSafeLoader as Loader
except ImportError:  # pragma: no cover
    from yaml import SafeLoader as Loader

HERE = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
RAW = os.path.join(HERE, 'raw')

PROVIDERS = {
    ('api.openai.com', '/v1/chat/completions'): 'openai',
    ('api.anthropic.com', '/v1/messages'): 'anthropic',
}
KEEP_REQ_HEADERS = ('host', 'user-agent', 'anthropic-version', 'anthropic-beta', 'content-type')
KEEP_RESP_HEADERS = ('content-type',)
SESSION_GAP_MS = 120_000


def compact(obj):
    return json.dumps(obj, ensure_ascii=False, separators=(',', ':'))


def one(v):
    if isinstance(v, list):
        return v[0] if v else None
    return v


def lower_headers(h):
    return {str(k).lower(): one(v) for k, v in (h or {}).items()}


def raw_body(x):
    """vcrpy body: str, bytes, {'string': ...} or None -> bytes or None."""
    if x is None:
        return None
    if isinstance(x, dict):
        x = x.get('string')
    if x is None:
        return None
    if isinstance(x, bytes):
        return x
    return str(x).encode('utf-8')


def decode(b, enc):
    if b is None or not enc:
        return b
    try:
        if enc == 'gzip':
            return gzip.decompress(b)
        if enc == 'deflate':
            return zlib.decompress(b)
        if enc == 'br':
            import brotli  # noqa
            return brotli.decompress(b)
    except Exception:
        return b
    return b


def parse_json(b):
    if b is None:
        return None
    try:
        return json.loads(b)
    except Exception:
        return None


# ---------------------------------------------------------------- SSE merging

def sse_events(text):
    """Yield the payload of every `data:` line."""
    for line in text.splitlines():
        if line.startswith('data:'):
            yield line[5:].strip()


def merge_openai_sse(text):
    chunks = bad = 0
    out = None
    choices = {}
    usage = None
    for data in sse_events(text):
        if data == '[DONE]':
            continue
        chunks += 1
        try:
            ev = json.loads(data)
        except Exception:
            bad += 1
            continue
        if out is None:
            out = {k: v for k, v in ev.items() if k not in ('choices', 'usage')}
            out['object'] = 'chat.completion'
        if ev.get('usage'):
            usage = ev['usage']
        for ch in ev.get('choices') or []:
            i = ch.get('index', 0)
            c = choices.setdefault(i, {'index': i, 'message': {'role': 'assistant', 'content': None},
                                       'finish_reason': None, 'logprobs': None})
            d = ch.get('delta') or {}
            m = c['message']
            if d.get('role'):
                m['role'] = d['role']
            for key in ('content', 'reasoning_content', 'reasoning', 'refusal'):
                if d.get(key) is not None:
                    m[key] = (m.get(key) or '') + d[key]
            for tc in d.get('tool_calls') or []:
                tcs = m.setdefault('tool_calls', [])
                idx = tc.get('index', 0)
                while len(tcs) <= idx:
                    tcs.append({'id': None, 'type': 'function', 'function': {'name': '', 'arguments': ''}})
                t = tcs[idx]
                if tc.get('id'):
                    t['id'] = tc['id']
                if tc.get('type'):
                    t['type'] = tc['type']
                f = tc.get('function') or {}
                if f.get('name'):
                    t['function']['name'] += f['name']
                if f.get('arguments'):
                    t['function']['arguments'] += f['arguments']
            if ch.get('finish_reason'):
                c['finish_reason'] = ch['finish_reason']
    if out is None:
        return None, chunks, bad
    out['choices'] = [choices[i] for i in sorted(choices)]
    out['usage'] = usage
    return out, chunks, bad


def merge_anthropic_sse(text):
    chunks = bad = 0
    msg = None
    partial = {}
    for data in sse_events(text):
        chunks += 1
        try:
            ev = json.loads(data)
        except Exception:
            bad += 1
            continue
        t = ev.get('type')
        if t == 'message_start':
            msg = dict(ev['message'])
            msg['content'] = list(msg.get('content') or [])
            msg['usage'] = dict(msg.get('usage') or {})
        elif msg is None:
            continue
        elif t == 'content_block_start':
            i = ev['index']
            while len(msg['content']) <= i:
                msg['content'].append(None)
            msg['content'][i] = dict(ev['content_block'])
        elif t == 'content_block_delta':
            i = ev['index']
            b = msg['content'][i]
            d = ev['delta']
            dt = d.get('type')
            if dt == 'text_delta':
                b['text'] = b.get('text', '') + d.get('text', '')
            elif dt == 'thinking_delta':
                b['thinking'] = b.get('thinking', '') + d.get('thinking', '')
            elif dt == 'signature_delta':
                b['signature'] = b.get('signature', '') + d.get('signature', '')
            elif dt == 'input_json_delta':
                partial[i] = partial.get(i, '') + d.get('partial_json', '')
            elif dt == 'citations_delta':
                b.setdefault('citations', []).append(d.get('citation'))
            else:
                b.setdefault('_unmerged_deltas', []).append(d)
        elif t == 'content_block_stop':
            i = ev['index']
            if i in partial:
                s = partial.pop(i)
                try:
                    msg['content'][i]['input'] = json.loads(s) if s else {}
                except Exception:
                    msg['content'][i]['input'] = s
        elif t == 'message_delta':
            for k, v in (ev.get('delta') or {}).items():
                msg[k] = v
            for k, v in (ev.get('usage') or {}).items():
                if v is not None:
                    msg['usage'][k] = v
        elif t == 'error':
            msg['_stream_error'] = ev.get('error')
    return msg, chunks, bad


# ---------------------------------------------------------------- cassette reading

def interactions(path):
    """Yield normalised exchanges from a cassette (pydantic-ai or vcrpy flavour)."""
    with open(path, 'rb') as f:
        doc = yaml.load(f.read(), Loader=Loader)
    # R vcr (ellmer) names them `http_interactions`.
    for n, it in enumerate(doc.get('interactions') or doc.get('http_interactions') or []):
        rq, rs = it['request'], it['response']
        u = urlsplit(rq.get('uri', ''))
        prov = PROVIDERS.get((u.hostname, u.path))
        if prov is None or str(rq.get('method', '')).upper() != 'POST':
            continue
        qh = lower_headers(rq.get('headers'))
        sh = lower_headers(rs.get('headers'))
        # request body
        if 'parsed_body' in rq:
            qjson = rq['parsed_body']
            cl = qh.get('content-length')
            qbytes = int(cl) if cl and str(cl).isdigit() else len(compact(qjson).encode())
        else:
            b = raw_body(rq.get('body'))
            qjson = parse_json(b)
            qbytes = len(b or b'')
        # response body
        st = rs.get('status')
        status = st.get('code') if isinstance(st, dict) else st
        if isinstance(status, dict):      # R vcr: status: {status_code: 200, ...}
            status = status.get('status_code')
        stream = chunks = bad = None
        if 'parsed_body' in rs:
            sjson = rs['parsed_body']
            sbytes = len(compact(sjson).encode())
            text = None
        else:
            b = decode(raw_body(rs.get('body')), sh.get('content-encoding'))
            sbytes = len(b or b'')
            sjson = parse_json(b)
            text = b.decode('utf-8', 'replace') if (sjson is None and b) else None
        if sjson is None and text is not None and 'data:' in text:
            stream = 'sse'
            if prov == 'openai':
                sjson, chunks, bad = merge_openai_sse(text)
                if sjson is not None and not sjson.get('usage'):
                    yield {'skip': 'openai stream without usage', 'n': n, 'provider': prov}
                    continue
            else:
                sjson, chunks, bad = merge_anthropic_sse(text)
        if not isinstance(qjson, dict) or sjson is None:
            yield {'skip': 'non-JSON body', 'n': n, 'provider': prov}
            continue
        date = sh.get('date')
        date_ms = None
        if date:
            try:
                date_ms = int(email.utils.parsedate_to_datetime(date).timestamp() * 1000)
            except Exception:
                date_ms = None
        proc = sh.get('openai-processing-ms')
        yield {
            'n': n, 'provider': prov, 'host': u.hostname, 'path': u.path, 'query': u.query,
            'req_headers': {k: str(qh[k]) for k in KEEP_REQ_HEADERS if qh.get(k) is not None},
            'req_bytes': qbytes, 'req': qjson,
            'status': int(status), 'resp_headers': {k: str(sh[k]) for k in KEEP_RESP_HEADERS if sh.get(k)},
            'resp_bytes': sbytes, 'resp': sjson, 'stream': stream, 'chunks': chunks, 'bad_chunks': bad,
            'date_ms': date_ms, 'proc_ms': int(float(proc)) if proc not in (None, '') else None,
        }


def usable(manifest):
    """Yield (src, rel, cassette, exchange-or-skip) over the manifest, dropping duplicate recordings.

    Some suites keep several cassettes that are byte-for-byte copies of one recording
    (openllmetry's *_legacy / *_with_events_with_content / *_with_events_with_no_content).
    An exchange whose response id (msg_… / chatcmpl-…) was already seen is a copy and is skipped.
    """
    seen = {}
    for src in sorted(manifest):
        for rel in manifest[src]['files']:
            path = os.path.join(RAW, src, rel)
            cassette = f'{src.replace("+", "/", 1)}:{rel}'
            for ex in interactions(path):
                if 'skip' not in ex:
                    rid = ex['resp'].get('id') if isinstance(ex['resp'], dict) else None
                    if rid:
                        key = (ex['provider'], rid)
                        if key in seen:
                            ex = {'skip': 'duplicate recording of ' + seen[key], 'n': ex['n'],
                                  'provider': ex['provider']}
                        else:
                            seen[key] = f'{cassette}#{ex["n"]}'
                yield src, rel, path, cassette, ex


def main():
    manifest = json.load(open(os.path.join(RAW, 'manifest.json')))
    blocks = {'openai': [], 'anthropic': []}
    skipped = []
    per_file = {}
    for src, rel, path, cassette, ex in usable(manifest):
        per_file.setdefault((src, rel, path, cassette), []).append(ex)
    for (src, rel, path, cassette), exl in per_file.items():
        if True:
            exs = []
            for ex in exl:
                if 'skip' in ex:
                    skipped.append({'cassette': cassette, 'interaction': ex['n'], 'provider': ex['provider'],
                                    'reason': ex['skip']})
                    continue
                ex['cassette'] = cassette
                ex['raw'] = os.path.relpath(path, HERE)
                exs.append(ex)
            for prov in ('openai', 'anthropic'):
                pe = [e for e in exs if e['provider'] == prov]
                if not pe:
                    continue
                if all(e['date_ms'] is not None for e in pe):
                    # split into recording sessions
                    cur = [pe[0]]
                    for e in pe[1:]:
                        prev = cur[-1]['date_ms']
                        if e['date_ms'] < prev or e['date_ms'] - prev > SESSION_GAP_MS:
                            blocks[prov].append({'dated': True, 'ex': cur})
                            cur = [e]
                        else:
                            cur.append(e)
                    blocks[prov].append({'dated': True, 'ex': cur})
                else:
                    blocks[prov].append({'dated': False, 'ex': pe})
    index = {}
    for prov, bl in blocks.items():
        dated = sorted([b for b in bl if b['dated']], key=lambda b: b['ex'][0]['date_ms'])  # stable
        synth = [b for b in bl if not b['dated']]
        if dated:
            last = max(e['date_ms'] for b in dated for e in b['ex'])
            base = (last // 86_400_000 + 1) * 86_400_000
        else:
            base = 1735689600000  # 2025-01-01T00:00:00Z
        for k, b in enumerate(synth):
            for j, e in enumerate(b['ex']):
                e['t_start'] = base + k * 3_600_000 + j * 1000
                e['t_first'] = e['t_start'] + 400
                e['t_end'] = e['t_start'] + 800
                e['time_source'] = 'synthetic'
        prev_end = None
        for b in dated:
            for e in b['ex']:
                e['t_end'] = e['t_first'] = e['date_ms']
                e['t_start'] = e['date_ms'] - (e['proc_ms'] if e['proc_ms'] is not None else 1)
                if prev_end is not None and e['t_start'] < prev_end <= e['t_end']:
                    e['t_start'] = prev_end   # keep time order == id order (Date has 1 s resolution)
                prev_end = e['t_end']
                e['time_source'] = 'date_header'
        ordered = dated + synth
        rid = 0
        lines = []
        idx = []
        for conn, b in enumerate(ordered, start=1):
            for e in b['ex']:
                rid += 1
                rec = {
                    'v': 1, 'id': rid, 'conn': conn,
                    't_start_ms': e['t_start'], 't_first_byte_ms': e['t_first'], 't_end_ms': e['t_end'],
                    'request': {
                        'method': 'POST', 'path': e['path'],
                        'headers': dict(sorted({**e['req_headers'], 'host': e['host']}.items())),
                        'body_bytes': e['req_bytes'], 'body': e['req'], 'body_text': None, 'digest': None,
                    },
                    'response': {
                        'status': e['status'], 'headers': e['resp_headers'], 'stream': e['stream'],
                        'chunks': e['chunks'], 'bad_chunks': e['bad_chunks'], 'body_bytes': e['resp_bytes'],
                        'truncated': False, 'body': e['resp'], 'body_text': None, 'digest': None,
                    },
                    'error': None, 'tokens': None,
                }
                lines.append(json.dumps(rec, ensure_ascii=False))
                idx.append({'id': rid, 'conn': conn, 'cassette': e['cassette'], 'raw': e['raw'],
                            'interaction': e['n'], 'query': e['query'], 'time_source': e['time_source']})
        with open(os.path.join(HERE, f'{prov}.jsonl'), 'w', encoding='utf-8') as f:
            for line in lines:
                f.write(line + '\n')
        index[f'{prov}.jsonl'] = idx
        print(f'{prov}: {rid} records', file=sys.stderr)
    with open(os.path.join(HERE, 'records_index.json'), 'w') as f:
        json.dump({'records': index, 'skipped': skipped}, f, indent=1)
    print(f'skipped: {len(skipped)}', file=sys.stderr)


if __name__ == '__main__':
    main()
