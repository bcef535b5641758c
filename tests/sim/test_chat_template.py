"""The chat template as pure functions: a continued assistant message is the same context."""

from __future__ import annotations

from devstack.sim import expected_tokens
from devstack.sim.chat_template import Message, chat_context, parse_messages

USER = {"role": "user", "content": "Why exit 0?"}


def test_continuing_an_open_assistant_message_is_the_same_context() -> None:
    """1. Take the first 5 tokens of an answer. 2. The context with them as an open
    assistant message equals the original context followed by them, so the engine's next
    tokens are the rest of the answer."""
    answer = expected_tokens(chat_context([USER]), 12)
    partial = "".join(answer[:5])
    continued = chat_context([USER, {"role": "assistant", "content": partial}],
                             add_generation_prompt=False, continue_final_message=True)
    assert continued == chat_context([USER]) + partial
    assert expected_tokens(continued, 7) == answer[5:]


def test_generation_prompt_and_closed_turns() -> None:
    """1. Without a generation prompt the context ends after the last turn. 2. Text parts
    are joined; a null content is empty. 3. Roles and contents both change the context."""
    assert chat_context([USER], add_generation_prompt=False).endswith("<|end|>\n")
    parts = {"role": "user", "content": [{"type": "text", "text": "Why "},
                                         {"type": "text", "text": "exit 0?"}]}
    assert chat_context([parts]) == chat_context([USER])
    assert parse_messages([{"role": "assistant", "content": None}]) == [
        Message("assistant", "")]
    assert chat_context([{"role": "system", "content": "Why exit 0?"}]) != chat_context([USER])


def test_malformed_messages_say_what_is_wrong() -> None:
    """Each malformed conversation gives a message naming the field, never an exception."""
    cases = [
        (None, "'messages'"),
        ([], "'messages'"),
        (["hi"], "messages[0]"),
        ([{"role": "bard", "content": "x"}], "messages[0].role"),
        ([USER, {"role": "user", "content": 5}], "messages[1].content"),
        ([{"role": "user", "content": [{"type": "image_url"}]}], "messages[0].content"),
    ]
    for value, word in cases:
        result = parse_messages(value)
        assert isinstance(result, str), (value, result)
        assert word in result, (value, result)
