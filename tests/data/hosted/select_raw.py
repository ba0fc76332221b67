#!/usr/bin/env python3
"""Copy the cassettes this corpus uses out of the fetched bare git mirrors into raw/.

Only needed to rebuild raw/ from scratch; convert.py reads raw/ and needs no network.
The mirrors were obtained with the session's `fetch` tool (bare git dirs under /work/.mirror).
Selection rules are written out here so they can be audited.
"""
import os, re, subprocess, sys, json

HERE = os.path.dirname(os.path.abspath(__file__))
RAW = os.path.join(HERE, 'raw')

SOURCES = {
    'pydantic+pydantic-ai': {
        'git': '/work/.mirror/pydantic+pydantic-ai/repo',
        'commit': '4fda38988f2939fa6ea9cdefcf120693e10ef491',
    },
    'traceloop+openllmetry': {
        'git': '/work/.mirror/traceloop+openllmetry/repo',
        'commit': '93429cfb9767e6b51db6cb35f6b70f758117669a',
    },
    'Arize-ai+openinference': {
        'git': '/work/.mirror/Arize-ai+openinference/repo',
        'commit': '1fe497f1d9f45a07eee55d97fe185e020560f9c7',
    },
}

ANTH = 'api.anthropic.com/v1/messages'
OAI = 'api.openai.com/v1/chat/completions'


def want(src, path, text):
    """Return True when this cassette is used."""
    if not path.endswith('.yaml') or 'cassettes/' not in path:
        return False
    if 'crewai' in path.lower():          # held-out family, never used
        return False
    if src == 'pydantic+pydantic-ai':
        # Anthropic only (pydantic-ai's OpenAI chat cassettes are already used elsewhere).
        if ANTH not in text:
            return False
        if '/test_multimodal_tool_returns/' in path:   # bulky base64 media matrix, 1-2 calls each
            return False
        # size budget: drop near-duplicate single-call matrices
        if ('/test_tool_availability_portability_matrix[' in path
                or '/test_tool_choice_matrix/' in path or re.search(r'/test_anthropic_opus_\d+_features', path)):
            return False
        return True
    if src == 'traceloop+openllmetry':
        p = path
        if 'opentelemetry-instrumentation-anthropic/' in p:
            return ('/test_prompt_caching/' in p
                    or '/test_anthropic_tools_history_' in p
                    or p.endswith('/test_anthropic_image_with_history.yaml'))
        if 'opentelemetry-instrumentation-openai/tests/traces/cassettes/' in p:
            return (('/test_prompt_caching/' in p or '/test_functions/' in p
                     or '/test_chat/test_chat_tool_calls' in p
                     or '/test_chat/test_chat_pydantic_based_tool_calls' in p
                     or p.endswith('/test_chat/test_chat_history_message_dict.yaml'))
                    and '_streaming' not in p)
        # (langchain test_agents and the streaming test_functions cassettes were dropped: their
        #  OpenAI streams carry no usage, so no exchange survived conversion)
        if 'opentelemetry-instrumentation-llamaindex/tests/cassettes/test_agents/' in p:
            return True
        if 'opentelemetry-instrumentation-agno/tests/cassettes/' in p:
            return ('with_tools' in p or '/test_team/test_team_discussion' in p)
        return False
    if src == 'Arize-ai+openinference':
        if 'TestTokenCounts' in path:     # usage numbers are hand-edited in these (e.g. input_tokens 100 for "Hello!")
            return False
        if '/test_manual_instrumentation/' in path:
            return False
        # streams without usage (nothing survives conversion), and trivial single calls dropped for size
        if ('TestAssistantAgent.test_agent_run' in path or 'test_raw_dict_message' in path
                or 'test_input_value_image_hiding' in path or '/TestLM.' in path
                or 'openlit' in path or 'openinference-instrumentation-openllmetry' in path
                or 'test_rag_module' in path or 'test_context_attributes_are_instrumented' in path
                or path.endswith('openinference-instrumentation-langchain/tests/cassettes/test_instrumentor/test_token_counts.yaml')):
            # (that last one has hand-edited usage: cached_tokens 1, audio_tokens 2, reasoning_tokens 3)
            return False
        if OAI in text:
            return True
        if ANTH in text:
            return ('messages_token_counts' in path or 'multiple_tool_calling' in path
                    or 'tool_use_in_input' in path)
        return False
    return False


def main():
    manifest = {}
    for src, cfg in SOURCES.items():
        git = ['git', '--git-dir=' + cfg['git']]
        ls = subprocess.run(git + ['ls-tree', '-r', cfg['commit']], capture_output=True, text=True, check=True).stdout
        files = []
        for line in ls.splitlines():
            meta, path = line.split('\t', 1)
            _, typ, sha = meta.split()
            if typ != 'blob' or not path.endswith('.yaml') or 'cassettes/' not in path:
                continue
            r = subprocess.run(git + ['cat-file', 'blob', sha], capture_output=True)
            if r.returncode != 0:
                continue  # file absent from snapshot (>= 4 MiB)
            text = r.stdout.decode('utf-8', 'replace')
            if want(src, path, text):
                out = os.path.join(RAW, src, path)
                os.makedirs(os.path.dirname(out), exist_ok=True)
                with open(out, 'wb') as f:
                    f.write(r.stdout)
                files.append(path)
        lic = subprocess.run(git + ['show', cfg['commit'] + ':LICENSE'], capture_output=True, check=True).stdout
        with open(os.path.join(RAW, src, 'LICENSE'), 'wb') as f:
            f.write(lic)
        manifest[src] = {'commit': cfg['commit'], 'files': sorted(files)}
        print(src, len(files), file=sys.stderr)
    with open(os.path.join(RAW, 'manifest.json'), 'w') as f:
        json.dump(manifest, f, indent=1)
    # prune cassettes from which nothing survives conversion (streams without usage,
    # byte-for-byte copies of another cassette's recording), so raw/ keeps only what is used
    sys.path.insert(0, HERE)
    import convert
    kept = {}
    for src, rel, path, cassette, ex in convert.usable(manifest):
        kept.setdefault((src, rel), False)
        if 'skip' not in ex:
            kept[(src, rel)] = True
    for (src, rel), ok in kept.items():
        if not ok:
            os.remove(os.path.join(RAW, src, rel))
            manifest[src]['files'].remove(rel)
            print('pruned', src, rel, file=sys.stderr)
    for src in manifest:
        for rel in list(manifest[src]['files']):
            if (src, rel) not in kept:   # no OpenAI chat / Anthropic messages exchange at all
                os.remove(os.path.join(RAW, src, rel))
                manifest[src]['files'].remove(rel)
                print('pruned (no exchange)', src, rel, file=sys.stderr)
    with open(os.path.join(RAW, 'manifest.json'), 'w') as f:
        json.dump(manifest, f, indent=1)
    for root, dirs, files in os.walk(RAW, topdown=False):
        if not files and not dirs:
            os.rmdir(root)


if __name__ == '__main__':
    main()
