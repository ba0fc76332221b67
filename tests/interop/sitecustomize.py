"""Test-only workaround for AIPerf 0.13.0, put on PYTHONPATH by tests/export_interop.rs.

AIPerf's trace loaders decode prompts in worker processes that force Hugging Face offline mode,
and in offline mode AIPerf resolves every tokenizer name through the Hub cache
(`Tokenizer._resolve_local_snapshot` -> `snapshot_download`). validate.sh passes a local
tokenizer directory, so any mooncake or bailian trace of 10 rows or more (the batch size from
which AIPerf decodes in workers) fails with HFValidationError before a request is sent, whatever
the trace holds. Upstream fix: ai-dynamo/aiperf pull request #1339 (open), "load local paths in
offline workers": an existing local directory is returned as is. This applies that fix when
`aiperf.common.tokenizer` is imported, and changes nothing else.
"""

import importlib.abc
import importlib.util
import os
import sys

_TARGET = "aiperf.common.tokenizer"


def _patch(module):
    tokenizer = getattr(module, "Tokenizer", None)
    original = getattr(tokenizer, "_resolve_local_snapshot", None)
    if original is None:
        return
    original = original.__func__

    def _resolve_local_snapshot(cls, name, revision):
        path = os.path.expanduser(name)
        if os.path.isdir(path):
            return path
        return original(cls, name, revision)

    tokenizer._resolve_local_snapshot = classmethod(_resolve_local_snapshot)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != _TARGET:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            _patch(module)

        spec.loader.exec_module = exec_and_patch
        return spec


sys.meta_path.insert(0, _PatchOnImport())
