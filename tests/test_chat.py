"""vLLM's chat-form bodies render a conversation as transformers' `apply_chat_template(..., tokenize=False)`
does (unit level: the served path is in tests/test_tasks.py), on templates of the kinds the hub has."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from pooltriton.client.chat import NO_TEMPLATE, ChatError, render_chat

CHATML = (  # Qwen2's: a default system message, role headers, a generation prompt
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif %}\n"
    "{%- for message in messages %}{%- if not (message.role == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}{%- endif %}{%- endfor %}\n"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}\n")
ALTERNATING = (  # Mistral's kind: bos_token, raise_exception on roles out of turn, eos after answers
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% else %}{{ message['content'] + eos_token }}{% endif %}{% endfor %}")
PARTS = (  # a template that reads content as a list of parts (vLLM's "openai" format), namespace, break, tojson
    "{% set ns = namespace(count=0) %}{% for message in messages %}{{ message['role'] }}:"
    "{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% set ns.count = ns.count + 1 %}{% if ns.count > 5 %}{% break %}{% endif %}{% endfor %}\n{% endfor %}"
    "{{ {'n': ns.count, 'ü': 1} | tojson }}{% generation %}{% if add_generation_prompt %}>{% endif %}"
    "{% endgeneration %}")
CONVERSATION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is Triton?"},
                {"role": "assistant", "content": "A server."}, {"role": "user", "content": "And ONNX? "}]


def _tokenizer(template: str) -> PreTrainedTokenizerFast:
    plain = Tokenizer(models.WordLevel({"<unk>": 0, "<s>": 1, "</s>": 2}, unk_token="<unk>"))
    plain.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=plain, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    tokenizer.chat_template = template
    return tokenizer


def _as_parts(messages: list[dict]) -> list[dict]:
    return [{**m, "content": [{"type": "text", "text": m["content"]}]} for m in messages]


@pytest.mark.parametrize(("template", "messages"), [
    (CHATML, CONVERSATION), (CHATML, CONVERSATION[1:]), (ALTERNATING, CONVERSATION[1:]), (PARTS, CONVERSATION)])
@pytest.mark.parametrize(("generation", "continued"), [(False, False), (True, False), (False, True)])
def test_a_conversation_renders_as_transformers_renders_it(template, messages, generation, continued) -> None:
    tokenizer = _tokenizer(template)
    # what vLLM hands transformers: a parts-reading template gets parts, another the text
    given = _as_parts(messages) if template is PARTS else messages
    expected = tokenizer.apply_chat_template(given, tokenize=False, add_generation_prompt=generation,
                                             continue_final_message=continued)
    got = render_chat(template, tokenizer.special_tokens_map, messages, add_generation_prompt=generation,
                      continue_final_message=continued)
    assert got == expected
    # a list of text parts is read as vLLM reads it: joined by new lines for a template that reads strings
    parted = [*messages[:-1], {"role": "user", "content": [{"type": "text", "text": "And"},
                                                           {"type": "input_text", "text": "ONNX?"}]}]
    joined = [*given[:-1], {"role": "user", "content": "And\nONNX?"}] if template is not PARTS else \
        [*given[:-1], {"role": "user", "content": [{"type": "text", "text": "And"}, {"type": "text", "text": "ONNX?"}]}]
    assert render_chat(template, tokenizer.special_tokens_map, parted, add_generation_prompt=generation) == \
        tokenizer.apply_chat_template(joined, tokenize=False, add_generation_prompt=generation)


def test_what_cannot_be_rendered_is_a_chat_error_naming_why() -> None:
    tokens = _tokenizer(CHATML).special_tokens_map
    with pytest.raises(ChatError, match="default chat template is no longer allowed") as refused:
        render_chat(None, tokens, CONVERSATION)
    assert str(refused.value) == NO_TEMPLATE
    with pytest.raises(ChatError, match="Cannot set both"):
        render_chat(CHATML, tokens, CONVERSATION, add_generation_prompt=True, continue_final_message=True)
    with pytest.raises(ChatError, match="not a multimodal model"):
        render_chat(CHATML, tokens, [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])
    with pytest.raises(ChatError, match="roles must alternate"):  # the template's own raise_exception
        render_chat(ALTERNATING, tokens, [{"role": "assistant", "content": "hi"}])
    with pytest.raises(ChatError, match="not an accepted field"):  # transformers': the template must read content
        render_chat("{% for m in messages %}{{ m.role }}{% endfor %}", tokens, CONVERSATION,
                    continue_final_message=True)
    with pytest.raises(ChatError, match="messages is empty"):
        render_chat(CHATML, tokens, [])
    with pytest.raises(ChatError, match="cannot set chat_template"):
        render_chat(CHATML, tokens, CONVERSATION, chat_template_kwargs={"chat_template": "{{ 1 }}"})
    with pytest.raises(ChatError, match="does not compile"):
        render_chat("{% for %}", tokens, CONVERSATION)
    with pytest.raises(ChatError, match="ZeroDivisionError"):  # any failure of the template's own: a 400
        render_chat("{{ 1 / 0 }}", tokens, CONVERSATION)
    # the sandbox: no way out to Python's internals
    with pytest.raises(ChatError, match="unsafe"):
        render_chat("{{ ''.__class__.__mro__ }}", tokens, CONVERSATION)
    with pytest.raises(ChatError, match="cannot store '_x'"):
        render_chat("{% set ns = namespace() %}{% set ns._x = 1 %}", tokens, CONVERSATION)


# Loops that read a message's content as parts (vLLM's "openai" format), and loops over other things' content
READS_PARTS = ["{% for m in messages %}{% for p in m['content'] %}{{ p.text }}{% endfor %}{% endfor %}",
               "{% for m in messages[-1:] %}{% for p in m.content | list %}{{ p.text }}{% endfor %}{% endfor %}",
               "{% set last = messages[-1] %}{% for p in last['content'] %}{{ p['text'] }}{% endfor %}",
               "{% for m in messages %}{% set c = m['content'] %}{% for p in c %}{{ p.text }}{% endfor %}{% endfor %}"]
READS_TEXT = ["{% for m in messages %}{{ m['content'] }}{% endfor %}",
              "{% for m in messages %}{{ m.content }}{% endfor %}{% if tools %}{% for t in tools %}"
              "{% for x in t.content %}{{ x }}{% endfor %}{% endfor %}{% endif %}"]


@pytest.mark.parametrize(("template", "parts"), [*((t, True) for t in READS_PARTS),
                                                 *((t, False) for t in READS_TEXT)])
def test_a_template_gets_content_in_the_form_it_reads(template, parts) -> None:
    """vLLM's detection: parts for a loop over a message's content, a string otherwise (a bare string in a
    list of parts is a text part too)."""
    messages = [{"role": "user", "content": ["one", {"type": "text", "text": "two"}]}]
    got = render_chat(template, {}, messages)
    assert got == ("onetwo" if parts else "one\ntwo"), got


TOOLS = (  # a tool-using template: calls' arguments read as objects, tool results, names, reasoning
    "{% for m in messages %}{{ m.role }}:{{ m.content }}"
    "{% if m.tool_calls is defined %}{% for c in m.tool_calls %}<call {{ c.id }}>{{ c.function.name }} "
    "{{ c.function.arguments | tojson }}{% for k, v in c.function.arguments.items() %}[{{ k }}={{ v }}]{% endfor %}"
    "</call>{% endfor %}{% endif %}{% if m.tool_call_id %}#{{ m.tool_call_id }}{% endif %}"
    "{% if m.name %}@{{ m.name }}{% endif %}{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>"
    "{% endif %}{% if m.extra is defined %}EXTRA{% endif %}\n{% endfor %}")


def test_tool_calls_reach_the_template_as_vllm_hands_them() -> None:
    """vLLM's conversation messages: only its keys, an assistant's tool-call arguments parsed from JSON into objects
    ({} when absent, empty or not a JSON object), an empty tool_calls dropped, reasoning under both names."""
    sent = [{"role": "user", "content": "Weather?", "extra": 1, "name": "ann"},
            {"role": "assistant", "content": None, "reasoning": "look it up", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get", "arguments": '{"city": "Paris"}'}},
                {"id": "c2", "type": "function", "function": {"name": "now", "arguments": ""}},
                {"id": "c3", "function": {"name": "bad", "arguments": "not json"}},
                {"id": "c4", "function": {"name": "list", "arguments": "[1]"}}]},
            {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
            {"role": "assistant", "content": "Sunny.", "tool_calls": []}]
    handed = [{"role": "user", "content": "Weather?", "name": "ann"},
              {"role": "assistant", "content": "", "reasoning": "look it up", "reasoning_content": "look it up",
               "tool_calls": [
                   {"id": "c1", "type": "function", "function": {"name": "get", "arguments": {"city": "Paris"}}},
                   {"id": "c2", "type": "function", "function": {"name": "now", "arguments": {}}},
                   {"id": "c3", "function": {"name": "bad", "arguments": {}}},
                   {"id": "c4", "function": {"name": "list", "arguments": {}}}]},
              {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
              {"role": "assistant", "content": "Sunny."}]
    tokenizer = _tokenizer(TOOLS)
    got = render_chat(TOOLS, tokenizer.special_tokens_map, sent)
    assert got == tokenizer.apply_chat_template(handed, tokenize=False)
    assert '<call c1>get {"city": "Paris"}[city=Paris]</call>' in got and "EXTRA" not in got
    assert sent[1]["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'  # the caller's body is untouched
    for calls in ([1], [{"type": "code", "function": {"name": "x"}}], [{"id": "c"}], "c1"):
        with pytest.raises(ChatError, match="tool_calls"):
            render_chat(TOOLS, {}, [{"role": "assistant", "content": "", "tool_calls": calls}])
