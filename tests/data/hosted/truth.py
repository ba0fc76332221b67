#!/usr/bin/env python3
"""Build truth.json from openai.jsonl / anthropic.jsonl (+ records_index.json).

Mechanical part (computed):
  * run        -- records of one cassette recording session that belong to one conversation;
                  a record joins an earlier run of the same session when its messages extend (or
                  repeat) a record of that run, or when it has the same system prompt and the same
                  first non-system message; otherwise it starts a new run.
  * continues  -- the latest earlier record of the same run whose (normalised) messages are a
                  strict prefix of this record's messages. cache_control markers are ignored
                  when comparing (they are not prompt content).
  * real_break -- compared with the record this one follows in its run (the previous record
                  of the run): system prompt changed, tool definitions changed, or the earlier
                  messages are not kept as a prefix (history rewritten / dropped).
  * cacheable  -- OpenAI: response usage.prompt_tokens >= 1024 (null when no usage);
                  Anthropic: the request carries a cache_control marker anywhere.
Hand-made part: OVERRIDES below (run merges/splits and notes decided by reading the requests).
"""
import json
import os
import sys

# The corpus folder (its records and truth_overrides.py): the first argument, else this one.
HERE = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def strip_cc(x):
    if isinstance(x, dict):
        return {k: strip_cc(v) for k, v in x.items() if k != 'cache_control'}
    if isinstance(x, list):
        return [strip_cc(v) for v in x]
    return x


def has_cc(x):
    if isinstance(x, dict):
        return 'cache_control' in x or any(has_cc(v) for v in x.values())
    if isinstance(x, list):
        return any(has_cc(v) for v in x)
    return False


def canon(x):
    return json.dumps(x, sort_keys=True, ensure_ascii=False, separators=(',', ':'))


def parts(prov, body):
    """-> (system, tools, messages, first_non_system) all normalised."""
    msgs = body.get('messages') or []
    if prov == 'openai':
        sys_msgs = []
        for m in msgs:
            if m.get('role') in ('system', 'developer'):
                sys_msgs.append(m)
            else:
                break
        system = canon(sys_msgs) if sys_msgs else None
        tools = body.get('tools') or body.get('functions')
        nm = [canon(m) for m in msgs]
        rest = nm[len(sys_msgs):]
    else:
        s = body.get('system')
        system = canon(strip_cc(s)) if s not in (None, '', []) else None
        tools = strip_cc(body.get('tools'))
        nm = [canon(strip_cc(m)) for m in msgs]
        rest = nm
    return system, (canon(tools) if tools else None), nm, (rest[0] if rest else None)


def tool_names(prov, body):
    t = body.get('tools') or body.get('functions') or []
    out = []
    for x in t:
        if isinstance(x, dict):
            out.append((x.get('function') or {}).get('name') or x.get('name') or x.get('type'))
    return out


def is_prefix(a, b):
    return len(a) < len(b) and b[:len(a)] == a


# Manual decisions, keyed (cassette path inside its repo, interaction index in the cassette) ->
# fields to set: run_with=<interaction index of a record of the run to join>, new_run=True,
# add_note=<text>, or any truth field. Filled in after reading the runs (truth_overrides.py).
OVERRIDES = {}
try:
    from truth_overrides import OVERRIDES  # noqa
except ImportError:
    pass


def build(fn, prov, index):
    recs = [json.loads(l) for l in open(os.path.join(HERE, fn))]
    idx = {r['id']: r for r in index}
    out = []
    runs = []          # list of dicts: {'name', 'block', 'ids'}
    info = {}
    for r in recs:
        rid = r['id']
        body = r['request']['body']
        system, tools, nm, first = parts(prov, body)
        info[rid] = dict(system=system, tools=tools, msgs=nm, first=first, body=body, rec=r)
    by_key = {(x['cassette'].split(':', 1)[1], x['interaction']): x['id'] for x in index}
    for r in recs:
        rid = r['id']
        me = info[rid]
        block = (idx[rid]['cassette'], r['conn'])
        ov = OVERRIDES.get((idx[rid]['cassette'].split(':', 1)[1], idx[rid]['interaction']), {})
        target = None
        restart_of = None
        if 'run_with' in ov:
            other = by_key[(idx[rid]['cassette'].split(':', 1)[1], ov['run_with'])]
            target = next(R for R in runs if other in R['ids'])
        elif not ov.get('new_run'):
            for R in reversed(runs):
                if R['block'] == block and len(R['ids']) > 1:
                    f0, last = info[R['ids'][0]], info[R['ids'][-1]]
                    if me['msgs'] == f0['msgs'] and is_prefix(me['msgs'], last['msgs']):
                        restart_of = R['ids'][0]   # the conversation starts over: new run
                        break
                if R['block'] != block:
                    continue
                for oid in reversed(R['ids']):
                    o = info[oid]
                    if is_prefix(o['msgs'], me['msgs']) or o['msgs'] == me['msgs'] or \
                            (o['system'] == me['system'] and o['first'] is not None and o['first'] == me['first']):
                        target = R
                        break
                if target:
                    break
        if restart_of is not None:
            target = None
        if target is None:
            n = sum(1 for R in runs if R['block'][0] == block[0])
            cas = block[0]
            target = {'name': f'{fn.split(".")[0]}:{cas.split(":", 1)[1]}#{n + 1}', 'block': block, 'ids': []}
            runs.append(target)
        prev_ids = list(target['ids'])
        target['ids'].append(rid)
        # continues
        cont = None
        best = -1
        for oid in prev_ids:
            o = info[oid]
            if is_prefix(o['msgs'], me['msgs']) and len(o['msgs']) >= best:
                best = len(o['msgs'])
                cont = oid
        # break relative to the record it follows
        brk = []
        notes = []
        if prev_ids:
            p = info[prev_ids[-1]]
            if p['system'] != me['system']:
                brk.append('system prompt changed' if p['system'] and me['system'] else
                           ('system prompt added' if me['system'] else 'system prompt removed'))
            if p['tools'] != me['tools']:
                a, b = tool_names(prov, p['body']), tool_names(prov, me['body'])
                if a == b:
                    brk.append('tool definitions changed (same names: %s)' % ','.join(map(str, b)))
                else:
                    add = [x for x in b if x not in a]
                    rem = [x for x in a if x not in b]
                    d = []
                    if add:
                        d.append('added ' + ','.join(map(str, add)))
                    if rem:
                        d.append('removed ' + ','.join(map(str, rem)))
                    if not d:
                        d.append('reordered')
                    brk.append('tools changed (' + '; '.join(d) + ')')
            pm, cm = p['msgs'], me['msgs']
            if cm == pm:
                notes.append(f'identical messages to id {prev_ids[-1]} (re-send)')
            elif not is_prefix(pm, cm):
                k = next((i for i in range(min(len(pm), len(cm))) if pm[i] != cm[i]), None)
                if k is None:
                    brk.append(f'history truncated: id {prev_ids[-1]} had {len(pm)} messages, this has {len(cm)}')
                else:
                    brk.append(f'history rewritten: keeps the first {k} of the {len(pm)} messages of id '
                               f'{prev_ids[-1]}, then differs')
            if p['body'].get('model') != me['body'].get('model'):
                notes.append('model changed %s -> %s' % (p['body'].get('model'), me['body'].get('model')))
            if prov == 'anthropic':
                for key in ('tool_choice', 'thinking'):
                    if canon(p['body'].get(key)) != canon(me['body'].get(key)):
                        notes.append(f'{key} changed')
                praw = [canon(m) for m in (p['body'].get('messages') or [])]
                craw = [canon(m) for m in (me['body'].get('messages') or [])]
                if is_prefix(pm, cm) and not is_prefix(praw, craw) and (has_cc(p['body'].get('messages'))
                                                                           or has_cc(me['body'].get('messages'))):
                    notes.append('cache_control breakpoint moved within kept history')
        if restart_of is not None:
            notes.append(f'starts the conversation of id {restart_of} over (identical request)')
        if cont is not None and prev_ids and cont != prev_ids[-1]:
            notes.append(f'continues id {cont}, not the record it follows (id {prev_ids[-1]})')
        # cacheable
        resp = (r['response'] or {}).get('body') or {}
        usage = resp.get('usage') if isinstance(resp, dict) else None
        if prov == 'openai':
            pt = (usage or {}).get('prompt_tokens')
            cacheable = None if pt is None else pt >= 1024
            if usage and (usage.get('prompt_tokens_details') or {}).get('cached_tokens'):
                notes.append('server reports cached_tokens=%d' % usage['prompt_tokens_details']['cached_tokens'])
        else:
            cacheable = has_cc(me['body'])
            if usage:
                cr, cc = usage.get('cache_read_input_tokens') or 0, usage.get('cache_creation_input_tokens') or 0
                if cr or cc:
                    notes.append(f'server reports cache_read={cr} cache_creation={cc}')
                if cacheable is False and (cr or cc):
                    notes.append('cache tokens without an explicit cache_control in the request')
        st = r['response']['status'] if r['response'] else None
        if st != 200:
            notes.append(f'HTTP {st}')
        if r['response'] and r['response']['stream']:
            notes.append('streamed (SSE merged)')
        t = {
            'id': rid,
            'cassette': idx[rid]['cassette'],
            'run': target['name'],
            'continues': cont,
            'real_break': '; '.join(brk) or None,
            'cacheable': cacheable,
            'notes': '; '.join(notes) or None,
        }
        for k, v in ov.items():
            if k in ('run_with', 'new_run'):
                continue
            if k == 'add_note':
                t['notes'] = (t['notes'] + '; ' if t['notes'] else '') + v
            else:
                t[k] = v
        out.append(t)
    return out


def main():
    index = json.load(open(os.path.join(HERE, 'records_index.json')))['records']
    truth = {}
    for fn, prov in (('openai.jsonl', 'openai'), ('anthropic.jsonl', 'anthropic')):
        truth[fn] = build(fn, prov, index[fn])
    with open(os.path.join(HERE, 'truth.json'), 'w') as f:
        json.dump(truth, f, indent=1, ensure_ascii=False)
    for fn, rows in truth.items():
        runs = {}
        for t in rows:
            runs.setdefault(t['run'], []).append(t)
        print(fn, 'records', len(rows), 'runs', len(runs),
              'multi-record runs', sum(1 for v in runs.values() if len(v) > 1),
              'continuations', sum(1 for t in rows if t['continues'] is not None),
              'real_breaks', sum(1 for t in rows if t['real_break']),
              'cacheable', sum(1 for t in rows if t['cacheable']), file=sys.stderr)


if __name__ == '__main__':
    main()
