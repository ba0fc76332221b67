"""Hand decisions for truth.json (corpus2), made after reading every multi-record cassette and
the test code that produced it. Key: (cassette path inside its repository, interaction index).

Conventions kept from the first hosted corpus (tests/data/hosted): a request identical to an
earlier one of the same cassette, or one whose messages strictly extend an earlier one, joins
that run (a "re-send" / continuation), even when the test code made it from a fresh agent or
chat object; such cases are noted here. Identical requests in *different* cassettes are always
different runs.
"""
OVERRIDES = {
    # ---- Future-House/ldp (OpenAI) ----
    # SimpleAgent(hide_old_env_states=True): one agent run; on its second step the agent replaces
    # the first env-state message '' by '[Previous environment state - hidden]'.
    ('tests/cassettes/TestSimpleAgent.test_hide_old_env_states.yaml', 1): {
        'run_with': 0,
        'real_break': 'history rewritten: the agent replaced its first user message (env state "") by '
                      '"[Previous environment state - hidden]" (hide_old_env_states=True)',
        'add_note': 'one agent run (agent_state_1 -> agent_state_2), see tests/test_agents.py',
    },
    # NumberGuesserModule called on x = Hello, Day, Bar: three independent compute graphs that
    # share the first user message; not one conversation.
    ('tests/cassettes/TestMemoryOpt.test_lessons_memory_optimizer.yaml', 1): {
        'new_run': True,
        'add_note': 'independent call (x="Day"); shares the first user message with the "Hello" call',
    },
    ('tests/cassettes/TestMemoryOpt.test_lessons_memory_optimizer.yaml', 2): {
        'new_run': True,
        'add_note': 'independent call (x="Bar"); shares the first user message with the "Hello" call',
    },
    ('tests/cassettes/test_online_trainer[True].yaml', 1): {
        'add_note': 'by the code a separate one-step rollout of the same task (identical request)'},
    ('tests/cassettes/test_online_trainer[True].yaml', 2): {
        'add_note': 'by the code a separate one-step rollout of the same task (identical request)'},
    ('tests/cassettes/test_online_trainer[True].yaml', 3): {
        'add_note': 'by the code a later rollout (after the memory update): the task message plus the '
                    'retrieved memories; kept in the run because it strictly extends the earlier request'},
    ('tests/cassettes/test_online_trainer[False].yaml', 1): {
        'add_note': 'by the code a separate one-step rollout of the same task (identical request)'},
    ('tests/cassettes/test_online_trainer[False].yaml', 2): {
        'add_note': 'by the code a separate one-step rollout of the same task (identical request)'},
    ('tests/cassettes/test_online_trainer[False].yaml', 3): {
        'add_note': 'by the code a later rollout (after the memory update): the task message plus the '
                    'retrieved memories; kept in the run because it strictly extends the earlier request'},
    # ---- Future-House/ldp (Anthropic) ----
    # test_anthropic_incremental_cache_with_conversation, call 4: "Skip messages 2 & 3 - test
    # partial cache hit": same test conversation, history deliberately cut back. litellm merges the
    # two consecutive user messages into one user message with two text blocks.
    ('packages/lmi/tests/cassettes/TestCachedTokenCosts.test_anthropic_incremental_cache_with_conversation.yaml', 3): {
        'run_with': 0,
        'real_break': 'history rewritten: call 4 keeps only the first user question and adds "What is your '
                      'FOURTH task?" (litellm merges them into one user message), dropping the 4 turns '
                      'between; only the system prompt is still a shared prefix (server: cache_read=2611)',
    },
    # ---- tidyverse/ellmer ----
    # vignette prompt-design "code-styles": two separate chat_anthropic() objects with different
    # system prompts asking the same question.
    ('vignettes/_vcr/prompt-design-code-styles.yml', 1): {
        'new_run': True,
        'add_note': 'a second chat_anthropic() with another system prompt (base R instead of data.table), '
                    'same question',
    },
    # web search with thinking: the next request re-sends the assistant turn without the (empty,
    # signature-only) thinking block and without the citations of id 101's response. Not a break
    # against the previous *request*, but the server's cache (written while generating 101) does
    # not match: it reads only the 2836 tokens up to the user turn.
    ('tests/testthat/_vcr/anthropic-web-search.yml', 1): {
        'add_note': 'assistant turn re-sent without the thinking block and citations of the previous '
                    'response; server reads only 2836 of ~13.9k cached tokens (client echo, not a provider miss)'},
    # ---- posit-dev/chatlas ----
    ('tests/_vcr/test_provider_anthropic/test_anthropic_respects_turns_interface.yaml', 1): {
        'add_note': 'by the code a second Chat object (system prompt set as an attribute) sending the same request'},
    ('tests/_vcr/test_provider_openai_completions/test_openai_respects_turns_interface.yaml', 1): {
        'add_note': 'by the code a second Chat object (system prompt set as an attribute) sending the same request'},
}
