#!/usr/bin/env python3
"""Copy the cassettes this corpus uses out of the fetched bare git mirrors into raw/.

Only needed to rebuild raw/ from scratch; convert.py reads raw/ and needs no network.
Mirrors come from the session's `fetch` tool (bare git dirs under /work/.mirror).
Rule: every YAML cassette (vcrpy `interactions:` or R-vcr `http_interactions:`) that holds at
least one POST to api.openai.com/v1/chat/completions or api.anthropic.com/v1/messages.
"""
import json, os, subprocess, sys
from urllib.parse import urlsplit
import yaml
try:
    from yaml import CSafeLoader as Loader
except ImportError:
    from yaml import SafeLoader as Loader

HERE = os.path.dirname(os.path.abspath(__file__))
RAW = os.path.join(HERE, 'raw')
SOURCES = {
    'posit-dev+chatlas': {'license': 'MIT', 'license_files': ['LICENSE'], 'under': 'tests/_vcr/'},
    'tidyverse+ellmer': {'license': 'MIT', 'license_files': ['LICENSE', 'LICENSE.md'], 'under': ''},
    'Future-House+ldp': {'license': 'Apache-2.0', 'license_files': ['LICENSE'], 'under': ''},
}
WANT = {('api.openai.com', '/v1/chat/completions'), ('api.anthropic.com', '/v1/messages')}


def git(gd, *a, text=True):
    return subprocess.run(['git', '--git-dir', gd, *a], capture_output=True, text=text, check=True).stdout


def main():
    manifest = {}
    for src, cfg in SOURCES.items():
        gd = f'/work/.mirror/{src}/repo'
        commit = git(gd, 'rev-parse', 'HEAD').strip()
        files = []
        for p in git(gd, 'ls-tree', '-r', '--name-only', commit).split('\n'):
            if not p.startswith(cfg['under']) or not p.endswith(('.yaml', '.yml')):
                continue
            raw = git(gd, 'show', f'{commit}:{p}', text=False)
            if b'api.openai.com' not in raw and b'api.anthropic.com' not in raw:
                continue
            try:
                doc = yaml.load(raw, Loader=Loader)
            except Exception:
                continue
            if not isinstance(doc, dict):
                continue
            its = doc.get('interactions') or doc.get('http_interactions') or []
            if not any((urlsplit(it['request'].get('uri', '')).hostname,
                        urlsplit(it['request'].get('uri', '')).path) in WANT
                       and str(it['request'].get('method', '')).upper() == 'POST' for it in its):
                continue
            out = os.path.join(RAW, src, p)
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with open(out, 'wb') as f:
                f.write(raw)
            files.append(p)
        for lf in cfg['license_files']:
            with open(os.path.join(RAW, src, lf), 'wb') as f:
                f.write(git(gd, 'show', f'{commit}:{lf}', text=False))
        manifest[src] = {'commit': commit, 'license': cfg['license'], 'files': sorted(files)}
        print(src, commit, len(files), file=sys.stderr)
    with open(os.path.join(RAW, 'manifest.json'), 'w') as f:
        json.dump(manifest, f, indent=1)


if __name__ == '__main__':
    main()
