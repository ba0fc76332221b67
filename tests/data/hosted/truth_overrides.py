"""Hand decisions for truth.json, made by reading the requests (see README.md).

Key: (cassette path inside its repository, index of the interaction in the cassette).
"""
OI = 'python/instrumentation/openinference-instrumentation-'
OL = 'packages/opentelemetry-instrumentation-'
PAI = 'tests/'

DSPY_REACT = OI + 'dspy/tests/openinference/instrumentation/dspy/cassettes/test_instrumentor/test_react[False].yaml'
DSPY_COMPILE = OI + 'dspy/tests/openinference/instrumentation/dspy/cassettes/test_instrumentor/test_compilation.yaml'
OI_CACHED = OI + 'openai/tests/openinference/instrumentation/openai/cassettes/test_tool_calls/test_cached_tokens.yaml'
OL_PC = OL + 'openai/tests/traces/cassettes/test_prompt_caching/'
AGUI = PAI + 'cassettes/test_cache_prefix_stability/'
TSE = PAI + 'cassettes/test_tool_search/test_tool_search_eval[anthropic].yaml'
LAZY = PAI + 'models/cassettes/test_anthropic/'
CEF = PAI + 'cassettes/test_code_execution_files_vcr/'

_compile_note = ('DSPy BootstrapFewShot compile: every call is an independent prediction; later calls '
                 'prepend earlier question/answer pairs as few-shot demos, so they extend or branch '
                 'from earlier calls\' message prefixes')

OVERRIDES = {
    # DSPy ReAct: one agent loop that re-renders a single user message (the trajectory is pasted
    # into it) instead of appending messages, then a final extract step with another signature.
    (DSPY_REACT, 1): {'run_with': 0,
                      'real_break': 'history rewritten: the only user message is re-rendered with the '
                                    'trajectory inside it (no messages appended); system prompt kept',
                      'add_note': 'DSPy ReAct step 2'},
    (DSPY_REACT, 2): {'run_with': 0,
                      'real_break': 'system prompt changed (ReAct -> extract signature) and the user '
                                    'message re-rendered with the full trajectory',
                      'add_note': 'DSPy ReAct final extract step'},
    (DSPY_COMPILE, 0): {'add_note': _compile_note},
    (DSPY_COMPILE, 1): {'add_note': _compile_note},
    # openinference test_cached_tokens: two single-message requests, same 2012-char start, different tail
    (OI_CACHED, 1): {'add_note': 'independent request; its only user message shares its first 2012 '
                                 'characters with the request of the previous record (interaction 0) and '
                                 'only the tail differs; server reports cached_tokens=1280 (token-level '
                                 'prefix reuse across runs)'},
    # openllmetry OpenAI prompt caching, 2026 session
    (OL_PC + 'test_openai_prompt_caching.yaml', 3): {
        'add_note': 'no cached_tokens although the identical prompt was sent ~7 s earlier'},
    (OL_PC + 'test_openai_prompt_caching_with_events_with_content.yaml', 2): {
        'add_note': 'first request of its run already reads 1024 cached tokens: same system+user text as '
                    'the test_openai_prompt_caching run recorded seconds before (cross-run reuse)'},
    (OL_PC + 'test_openai_prompt_caching_async_with_events_with_content.yaml', 2): {
        'add_note': 'first request of its run already reads 1024 cached tokens (cross-run reuse of the '
                    'test_openai_prompt_caching_async prompt)'},
    # pydantic-ai ag-ui / vercel replays
    (AGUI + 'test_anthropic_thinking_agui_0_1_10_drops_prefix.yaml', 2): {
        'add_note': 'same conversation replayed through the ag-ui 0.1.10 adapter, which drops the '
                    'thinking block of the assistant turn (test name: drops_prefix)'},
    (AGUI + 'test_anthropic_thinking_roundtrip_wire_stable[ag_ui-0_1_13].yaml', 2): {
        'add_note': 'same conversation replayed through the ag-ui 0.1.13 adapter: byte-identical history'},
    (AGUI + 'test_anthropic_thinking_roundtrip_wire_stable[vercel].yaml', 2): {
        'add_note': 'same conversation replayed through the Vercel AI adapter: byte-identical history'},
    # tool search: discovered tools are added to `tools` mid-run
    (TSE, 1): {'add_note': 'search_tools result makes the agent add the discovered tool definition'},
    (TSE, 4): {'add_note': 'search_tools result makes the agent add the discovered tool definition'},
    (LAZY + 'test_anthropic_fable_5_lazy_advertisement_live.yaml', 1): {
        'add_note': 'load_capability adds lookup_refund_policy to tools and announces it in a '
                    'mid-conversation system message'},
    (LAZY + 'test_anthropic_lazy_advertisement_live.yaml', 1): {
        'add_note': 'load_capability adds lookup_refund_policy to tools and announces it in a '
                    'mid-conversation system message'},
    # cache warmed by other tests
    (CEF + 'test_anthropic_code_execution_files_cache_prefix_stable[automatic-sonnet-4-6].yaml', 1): {
        'add_note': 'first request of its run already reads cache (prefix warmed by other tests of '
                    'the same suite)'},
    (CEF + 'test_anthropic_code_execution_files_cache_prefix_stable[automatic-sonnet-5].yaml', 1): {
        'add_note': 'first request of its run already reads cache (prefix warmed by other tests)'},
    (CEF + 'test_anthropic_code_execution_files_cache_prefix_stable[messages-sonnet-4-6].yaml', 1): {
        'add_note': 'first request of its run already reads cache (prefix warmed by other tests)'},
    (CEF + 'test_anthropic_code_execution_files_cache_prefix_stable[messages-sonnet-5].yaml', 1): {
        'add_note': 'first request of its run already reads cache (prefix warmed by other tests)'},
    (LAZY + 'test_anthropic_cache_count_tokens.yaml', 1): {
        'add_note': 'first request of its run already reads cache (same prompt as test_anthropic_cache_real_api)'},
    (LAZY + 'test_anthropic_cache_real_api.yaml', 0): {
        'add_note': 'first request of its run already reads cache (same prompt as test_anthropic_cache_count_tokens)'},
}
