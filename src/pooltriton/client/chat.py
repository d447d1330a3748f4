"""vLLM's chat-form pooling requests (`messages` instead of `input`): the conversation rendered by the model's
own chat template, as transformers renders it, then tokenized without special tokens unless asked (the
template writes them).

vLLM renders with `tokenizer.apply_chat_template(..., tokenize=False)` and tokenizes the text with the
request's `add_special_tokens` (default false); this does the same with the template and special tokens the
export carried (EnsembleParameters.chat_template / chat_tokens), in transformers' sandboxed jinja environment.
Text-only: a content part that is not text is refused, as vLLM refuses it for a model that is not multimodal.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

# vLLM's text parts; in a template that reads content as a string they are joined by new lines.
TEXT_PARTS = ("text", "input_text", "output_text", "refusal", "thinking")
REASONING = ("reasoning_content", "thinking", "reasoning")  # transformers' names for a message's reasoning
CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "  # transformers' mark of where the final message's text ends
NO_TEMPLATE = ("As of transformers v4.44, default chat template is no longer allowed, so you must provide a chat "
               "template if the tokenizer does not define one. (This model's tokenizer has none, or it was exported "
               "before pooltriton carried chat templates: export it again.)")


class ChatError(ValueError):
    """A conversation the model's template cannot render (HTTP 400), with the field it concerns."""

    def __init__(self, message: str, param: str = "messages") -> None:
        super().__init__(message)
        self.param = param


class _Generation(jinja2.ext.Extension):
    """transformers' `{% generation %}` block (it marks assistant tokens for training): rendered as its body."""

    tags = {"generation"}  # noqa: RUF012 (jinja's own class attribute)

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return caller()


class _Namespace(jinja2.utils.Namespace):
    """transformers' namespace: no underscore-prefixed attributes (CPython internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"chat templates cannot store {name!r} on a namespace")


class _Dict:
    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@lru_cache(maxsize=16)
def _compiled(template: str) -> tuple[jinja2.Template, bool]:
    """The template in transformers' environment, and whether it reads a message's content as a list of parts
    (vLLM's "openai" content format: a loop over `message['content']`) rather than as a string."""
    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=[_Generation, jinja2.ext.loopcontrols])
    environment.filters["tojson"] = _tojson
    environment.globals.update(raise_exception=_raise_exception, dict=_Dict(), namespace=_Namespace,
                               strftime_now=lambda fmt: datetime.now().strftime(fmt))
    try:
        parsed = environment.parse(template)
        compiled = environment.from_string(template)
    except jinja2.exceptions.TemplateError as error:
        raise ChatError(f"the model's chat template does not compile: {error}") from None
    return compiled, _loops_over_content(parsed)


def _loops_over_content(template: jinja2.nodes.Template) -> bool:
    """vLLM's content-format detection: a loop over a message's `content` (a message being a loop variable over
    `messages`, or a name set from one of them; the content read directly or through a name set from it)."""
    def base(node: jinja2.nodes.Node) -> jinja2.nodes.Node:  # through filters, slices and tests
        while (isinstance(node, jinja2.nodes.Filter | jinja2.nodes.Test) and node.node is not None) or \
                (isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Slice)):
            node = node.node
        return node

    def named(node: jinja2.nodes.Node, names: set[str]) -> bool:
        node = base(node)
        return isinstance(node, jinja2.nodes.Name) and node.name in names

    def content_of(node: jinja2.nodes.Node, messages: set[str]) -> bool:
        node = base(node)
        if isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Const):
            return node.arg.value == "content" and named(node.node, messages)
        return isinstance(node, jinja2.nodes.Getattr) and node.attr == "content" and named(node.node, messages)

    def item_of(node: jinja2.nodes.Node, names: set[str]) -> bool:  # messages[i], messages[-1], ...
        node = base(node)
        return isinstance(node, jinja2.nodes.Getitem) and named(node.node, names)

    messages, lists = set(), {"messages"}
    for _ in range(3):  # names set from names set from `messages`
        for assign in template.find_all(jinja2.nodes.Assign):
            if isinstance(assign.target, jinja2.nodes.Name):
                if named(assign.node, lists):
                    lists.add(assign.target.name)
                elif item_of(assign.node, lists):
                    messages.add(assign.target.name)
        for loop in template.find_all(jinja2.nodes.For):
            if isinstance(loop.target, jinja2.nodes.Name) and named(loop.iter, lists):
                messages.add(loop.target.name)
    contents = {assign.target.name for assign in template.find_all(jinja2.nodes.Assign)
                if isinstance(assign.target, jinja2.nodes.Name) and content_of(assign.node, messages)}
    return any(content_of(loop.iter, messages) or named(loop.iter, contents)
               for loop in template.find_all(jinja2.nodes.For))


def _message(index: int, message: Any, parts: bool) -> dict[str, Any]:
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise ChatError(f"messages[{index}] must be an object with a string `role`")
    content = message.get("content")
    if content is None or isinstance(content, str):
        texts = [] if content is None else [content]
    elif isinstance(content, list):
        texts = []
        for number, part in enumerate(content):
            if isinstance(part, str):  # vLLM reads a bare string in the list as a text part
                part = {"type": "text", "text": part}
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in TEXT_PARTS:
                raise ChatError(f"messages[{index}].content[{number}] is of type {kind!r}: this model is not a "
                                f"multimodal model, so it takes text parts only ({', '.join(TEXT_PARTS)})")
            text = part.get("text", part.get(kind))
            if not isinstance(text, str):
                raise ChatError(f"messages[{index}].content[{number}] has no text")
            texts.append(text)
    else:
        raise ChatError(f"messages[{index}].content must be a string or a list of parts")
    # vLLM's conversation message: these keys only (others are dropped), reasoning under both of its names
    rendered: dict[str, Any] = {"role": message["role"],
                                "content": [{"type": "text", "text": text} for text in texts] if parts
                                else "\n".join(texts)}
    role = message["role"]
    if role == "assistant":
        if message.get("tool_calls") is not None:
            calls = _tool_calls(index, message["tool_calls"])
            if calls:  # an empty list is dropped: the template takes its plain assistant path
                rendered["tool_calls"] = calls
        if message.get("reasoning") is not None:
            rendered["reasoning"] = rendered["reasoning_content"] = message["reasoning"]
    elif role == "tool" and message.get("tool_call_id") is not None:
        rendered["tool_call_id"] = message["tool_call_id"]
    if isinstance(message.get("name"), str):
        rendered["name"] = message["name"]
    if role == "developer" and message.get("tools") is not None:
        rendered["tools"] = message["tools"]
    reasoning = next((rendered[key] for key in REASONING if rendered.get(key) is not None), None)
    if reasoning is not None:  # transformers' aliases: templates read reasoning_content, gpt-oss's thinking
        rendered = {"thinking": reasoning, **rendered, "reasoning_content": reasoning}
    return rendered


def _tool_calls(index: int, calls: Any) -> list[dict[str, Any]]:
    """An assistant's tool calls as vLLM hands them to the template: function calls whose `arguments` (JSON text
    in OpenAI's format) are parsed into an object; arguments that are absent, empty, not JSON or not an object
    become {} (vLLM's coercion, so that one bad call in the history does not fail every later turn)."""
    if not isinstance(calls, list):
        raise ChatError(f"messages[{index}].tool_calls must be a list of tool calls")
    parsed = []
    for number, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(call, dict) or call.get("type", "function") != "function" or not isinstance(function, dict):
            raise ChatError(f"messages[{index}].tool_calls[{number}] must be an object of type 'function' with a "
                            "`function` object")
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                arguments = None
        parsed.append({**call, "function": {**function,
                                            "arguments": arguments if isinstance(arguments, dict) else {}}})
    return parsed


def render_chat(template: str | None, special_tokens: dict[str, str] | None, messages: list[Any], *,
                add_generation_prompt: bool = False, continue_final_message: bool = False,
                chat_template_kwargs: dict[str, Any] | None = None) -> str:
    """The conversation as the model's template writes it (transformers' `apply_chat_template(...,
    tokenize=False)`), its text parts as vLLM passes them; ChatError where it cannot be."""
    if not template:
        raise ChatError(NO_TEMPLATE)
    if add_generation_prompt and continue_final_message:
        raise ChatError("Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
                        "continue_final_message")
    if not messages:
        raise ChatError("messages is empty: send at least one message")
    if continue_final_message and "content" not in template:  # transformers' check: the template must read it
        raise ChatError('continue_final_message is set to "content" but this is not an accepted field in the '
                        "chat_template", "continue_final_message")
    extra = dict(chat_template_kwargs or {})
    refused = sorted(set(extra) & {"chat_template", "tokenize"})
    if refused:
        raise ChatError(f"chat_template_kwargs cannot set {', '.join(refused)}: this server renders the model's own "
                        "template", "chat_template_kwargs")
    compiled, parts = _compiled(template)
    conversation = [_message(index, message, parts) for index, message in enumerate(messages)]
    final = _tag_final(conversation[-1], parts) if continue_final_message else None
    try:
        text = compiled.render(**{**(special_tokens or {}), "tools": None, "documents": None, **extra,
                                  "messages": conversation, "add_generation_prompt": add_generation_prompt})
    except jinja2.exceptions.TemplateError as error:
        raise ChatError(f"the model's chat template refused the conversation: {error}") from None
    except Exception as error:  # the template's own failure on this input: a 400, as vLLM answers it
        raise ChatError(f"the model's chat template could not render the conversation "
                        f"({type(error).__name__}: {error})") from None
    if final is None:
        return text
    # transformers' continue_final_message: the text cut where the final message's content ends
    if final.strip() not in text or CONTINUE_TAG.strip() not in text:
        raise ChatError("continue_final_message is set but the final message does not appear in the chat after "
                        "applying the chat template", "continue_final_message")
    at = text.rindex(CONTINUE_TAG.strip())
    return text[:at] if text[at:at + len(CONTINUE_TAG)] == CONTINUE_TAG else text[:at].rstrip()


def _tag_final(message: dict[str, Any], parts: bool) -> str:
    """The final message's text, marked at its end (CONTINUE_TAG) for `render_chat` to cut there."""
    if parts:
        if not message["content"]:
            raise ChatError("continue_final_message is set but the final message has no text to continue",
                            "continue_final_message")
        final = message["content"][-1]["text"]
        message["content"][-1] = {"type": "text", "text": final + CONTINUE_TAG}
        return final
    final = message["content"]
    message["content"] = final + CONTINUE_TAG
    return final
