"""Chat requests to prompts and back, without an engine: which encoding, which tool mode
and constraint (server/chat.py), and how a choice's text reads as a message, whole or
streamed (server/chat_output.py)."""
from __future__ import annotations

import json
import statistics

import pytest
from pydantic import ValidationError

from runtime.engine.ids_snapshot import IdsSnapshot
from runtime.engine.output_processor import RequestOutput
from runtime.text.grammar import ANYTHING, Reasoning, StructuredOutputs
from runtime.text.growing_text import CHUNK
from runtime.text.tokenizer import Tokenizer
from server import chat, v4_encoding
from server.chat import ChatOptions, ChatPlan
from server.chat_output import ChatOutput
from server.protocol import APIError, ChatCompletionRequest
from server.responses import ChoiceState
from tests.conftest import REPO
from tests.runtime.allocation import peak_bytes, tracing
from tests.server.v4_tokenizer import write_v4_tokenizer

TINY = REPO / "models" / "tiny"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time"}}
PARSERS = ChatOptions("deepseek_v4", "deepseek_v4", True)


@pytest.fixture(scope="module")
def v4(tmp_path_factory) -> Tokenizer:
    return Tokenizer(write_v4_tokenizer(tmp_path_factory.mktemp("v4")))


@pytest.fixture(scope="module")
def tiny() -> Tokenizer:
    return Tokenizer(TINY)


def _request(**body) -> ChatCompletionRequest:
    body.setdefault("messages", [{"role": "user", "content": "Weather in Paris?"}])
    return ChatCompletionRequest.model_validate(body)


def test_a_v4_vocabulary_gets_the_v4_encoding(v4):
    req = _request(tools=[WEATHER], chat_template_kwargs={"thinking": True})
    plan = chat.plan(v4, req, PARSERS)
    want = v4_encoding.encode([{"role": "user", "content": "Weather in Paris?"}],
                              thinking=True, tools=[WEATHER])
    assert plan.prompt_ids == v4.encode(want, add_special_tokens=False)
    assert v4.decode(plan.prompt_ids, skip_special_tokens=False) == want
    assert plan.thinking and plan.tool_mode == "auto"
    # auto mode: the reasoning, then free text whose call blocks are held to the tools
    assert plan.structured.reasoning.end_id == v4.token_id("</think>")
    assert 'invoke name=\\"get_weather\\">' in plan.structured.grammar


def test_other_vocabularies_keep_their_chat_template(tiny):
    plan = chat.plan(tiny, _request(), ChatOptions())
    assert tiny.decode(plan.prompt_ids) == "<|user|>\nWeather in Paris?\n<|assistant|>\n"


@pytest.mark.parametrize("body, thinking", [
    ({}, False),
    ({"thinking": {"type": "enabled"}}, True),
    ({"thinking": {"type": "disabled"}, "chat_template_kwargs": {"thinking": True}}, False),
    ({"chat_template_kwargs": {"enable_thinking": True}}, True),
])
def test_thinking_is_asked_for_by_either_switch(v4, body, thinking):
    assert chat.plan(v4, _request(**body), PARSERS).thinking is thinking


def test_reasoning_effort_maps_to_the_formats_two_levels(v4):
    def prompt(effort):
        req = _request(thinking={"type": "enabled"}, reasoning_effort=effort)
        return v4.decode(chat.plan(v4, req, PARSERS).prompt_ids, skip_special_tokens=False)

    assert prompt("max").startswith(v4_encoding.BOS + v4_encoding.REASONING_EFFORT_MAX)
    assert prompt("low") == prompt("high") == prompt(None)
    with pytest.raises(APIError, match="reasoning_effort"):
        prompt("extreme")


def test_tool_modes_and_their_constraints(v4):
    named = chat.plan(v4, _request(tools=[WEATHER, TIME], tool_choice={
        "type": "function", "function": {"name": "get_weather"}}), ChatOptions())
    assert named.tool_mode == "named" and named.tool_name == "get_weather"
    assert json.loads(named.structured.json) == WEATHER["function"]["parameters"]
    required = chat.plan(v4, _request(tools=[WEATHER, TIME], tool_choice="required",
                                      parallel_tool_calls=False), ChatOptions())
    schema = json.loads(required.structured.json)
    assert schema["minItems"] == schema["maxItems"] == 1
    assert [c["properties"]["name"]["enum"] for c in schema["items"]["anyOf"]] \
        == [["get_weather"], ["get_time"]]
    # without a reasoning parser, a constrained request is rendered without thinking:
    # the grammar starts at once
    assert not chat.plan(v4, _request(tools=[WEATHER], tool_choice="required",
                                      thinking={"type": "enabled"}), ChatOptions()).thinking
    none = chat.plan(v4, _request(tools=[WEATHER], tool_choice="none"), ChatOptions())
    assert none.tool_mode == "none"
    assert "get_weather" not in v4.decode(none.prompt_ids, skip_special_tokens=False)


@pytest.mark.parametrize("body, options, param", [
    ({"tools": [WEATHER]}, ChatOptions(), "tool_choice"),        # auto needs the flags
    ({"tools": [WEATHER], "tool_choice": "auto"}, ChatOptions("deepseek_v4"), "tool_choice"),
    ({"tool_choice": "required"}, PARSERS, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     PARSERS, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": "required",
      "response_format": {"type": "json_object"}}, PARSERS, "response_format"),
    ({"guided_regex": "a", "guided_choice": ["a"]}, PARSERS, "guided_choice"),
    ({"chat_template_kwargs": {"thinking": "yes"}}, PARSERS, "chat_template_kwargs"),
])
def test_requests_that_cannot_be_served_are_400s(v4, body, options, param):
    with pytest.raises(APIError) as err:
        chat.plan(v4, _request(**body), options)
    assert err.value.status == 400 and err.value.param == param


def test_history_arguments_too_deep_to_parse_are_rendered_as_a_string(v4):
    deep = "[" * 100_000
    req = _request(messages=[
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "f", "arguments": deep}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"}])
    text = v4.decode(chat.plan(v4, req, PARSERS).prompt_ids, skip_special_tokens=False)
    assert f'<｜DSML｜parameter name="arguments" string="true">{deep}<' in text


# -- reading the output ----------------------------------------------------------------

DSML_TEXT = ('I will look it up.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n'
             '<｜DSML｜parameter name="city" string="true">Paris "centre"</｜DSML｜parameter>\n'
             '<｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>\n'
             '</｜DSML｜invoke>\n</｜DSML｜tool_calls>')


def _read(plan: ChatPlan, options: ChatOptions, pieces: list[str]) -> tuple[dict, dict]:
    """(the message, the streamed deltas folded together) of one output."""
    output = ChatOutput(plan, options)
    folded: dict = {"content": "", "reasoning_content": "", "tool_calls": {}}
    for i, piece in enumerate(pieces):
        delta = output.feed(piece, final=i == len(pieces) - 1)
        folded["content"] += delta.get("content", "")
        folded["reasoning_content"] += delta.get("reasoning_content", "")
        for call in delta.get("tool_calls", []):
            slot = folded["tool_calls"].setdefault(call["index"], {"arguments": ""})
            if "function" in call and "name" in call["function"]:
                assert "id" in call and call["type"] == "function"
                slot["name"] = call["function"]["name"]
            slot["arguments"] += call["function"].get("arguments", "")
    return output.message(), folded


def _splits(text: str):
    yield [text]
    for at in range(len(text) + 1):
        yield [text[:at], text[at:]]


def _assert_stream_is_message(plan, options, text):
    whole, _ = _read(plan, options, [text])
    for pieces in _splits(text):
        message, folded = _read(plan, options, pieces)
        assert folded["content"] == (message["content"] or "")
        assert folded["reasoning_content"] == message.get("reasoning_content", "")
        calls = [(c["function"]["name"], c["function"]["arguments"])
                 for c in message.get("tool_calls", [])]
        assert [(c["name"], c["arguments"]) for c in folded["tool_calls"].values()] == calls
        assert {k: v for k, v in message.items() if k != "tool_calls"} \
            == {k: v for k, v in whole.items() if k != "tool_calls"}
    return whole


def test_auto_tool_calls_and_reasoning_read_alike_whole_and_streamed():
    plan = ChatPlan([], True, "auto")
    whole = _assert_stream_is_message(plan, PARSERS, "Paris is in France.</think>" + DSML_TEXT)
    assert whole["reasoning_content"] == "Paris is in France."
    assert whole["content"] == "I will look it up."
    (call,) = whole["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": 'Paris "centre"', "days": 3}
    assert ChatOutput(plan, PARSERS).finish_reason("stop") == "stop"


def test_the_plan_carries_how_calls_are_read(v4, tiny):
    """The declared tools, parallel_tool_calls, and whether DSML is read: not where the
    output cannot hold the token (a V4 vocabulary under the client's own constraint)."""
    auto = chat.plan(v4, _request(tools=[WEATHER, TIME]), PARSERS)
    assert (auto.tool_names, auto.parallel, auto.read_calls) == (
        ("get_weather", "get_time"), True, True)
    one = chat.plan(v4, _request(tools=[WEATHER, TIME], parallel_tool_calls=False), PARSERS)
    assert not one.parallel
    named = chat.plan(v4, _request(tools=[WEATHER, TIME], tool_choice={
        "type": "function", "function": {"name": "get_time"}}), PARSERS)
    assert named.tool_names == ("get_time",)
    asked = _request(tools=[WEATHER], response_format={"type": "json_object"})
    assert not chat.plan(v4, asked, PARSERS).read_calls
    assert chat.plan(tiny, asked, PARSERS).read_calls          # there the markup is text


def test_calls_are_read_only_as_the_plan_allows():
    """Undeclared tools and, without parallel calls, a second call stay content; a block
    in the reasoning is reasoning (content without a reasoning parser), never a call."""
    forged = DSML_TEXT.replace("get_weather", "wipe_disk")
    plan = ChatPlan([], False, "auto", tool_names=("get_weather",))
    message, _ = _read(plan, PARSERS, [forged])
    assert message == {"role": "assistant", "content": forged}
    two = DSML_TEXT + DSML_TEXT.replace("I will look it up.", " Again.")
    message, _ = _read(ChatPlan([], False, "auto", tool_names=("get_weather",),
                                parallel=False), PARSERS, [two])
    assert len(message["tool_calls"]) == 1
    assert message["content"] == "I will look it up." + two[len(DSML_TEXT):]
    thought = "Maybe " + DSML_TEXT + "</think>" + DSML_TEXT
    for options in (PARSERS, ChatOptions(None, "deepseek_v4", True)):
        message, _ = _read(ChatPlan([], True, "auto", tool_names=("get_weather",)), options,
                           [thought])
        assert len(message["tool_calls"]) == 1
        said = (message.get("reasoning_content", "") or "") + message["content"]
        assert said == ("Maybe " + DSML_TEXT + ("" if options is PARSERS else "</think>")
                        + "I will look it up.")
    spelled = ChatPlan([], False, "auto", tool_names=("get_weather",), read_calls=False)
    assert _read(spelled, PARSERS, [DSML_TEXT])[0]["content"] == DSML_TEXT


def test_without_the_parsers_the_text_is_content():
    plan = ChatPlan([], True, "none")
    message, _ = _read(plan, ChatOptions(), ["a</think>" + DSML_TEXT])
    assert message == {"role": "assistant", "content": "a</think>" + DSML_TEXT}


def test_a_named_function_streams_its_arguments():
    plan = ChatPlan([], False, "named", "get_weather")
    text = '{"city": "Paris"}'
    whole = _assert_stream_is_message(plan, PARSERS, text)
    assert whole["content"] is None
    assert whole["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": text}
    output = ChatOutput(plan, PARSERS)
    output.feed(text, final=True)
    assert output.finish_reason("stop") == "tool_calls"
    assert output.finish_reason("length") == "length"


def test_required_calls_come_out_as_their_objects_close():
    plan = ChatPlan([], False, "required")
    text = ('[{"name": "get_weather", "parameters": {"city": "Paris"}}, '
            '{"name": "get_time", "parameters": {}}]')
    whole = _assert_stream_is_message(plan, PARSERS, text)
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in whole["tool_calls"]] == [("get_weather", {"city": "Paris"}),
                                              ("get_time", {})]
    cut = text[:70]                              # cut by max_tokens inside the second call
    message = _assert_stream_is_message(plan, PARSERS, cut)
    assert len(message["tool_calls"]) == 1 and message["content"] == cut[cut.rindex('{"name"'):]


@pytest.mark.parametrize("mode, answer", [
    ("none", '{"name": "Ada"}'),
    ("named", '{"city": "Paris"}'),
    ("required", '[{"name": "get_weather", "parameters": {"city": "Paris"}}]'),
])
def test_reasoning_comes_off_before_a_constrained_answer(mode, answer):
    """Reasoning-aware structured outputs: the reasoning goes to reasoning_content and
    the text after it is read as the mode reads it, at every split point."""
    plan = ChatPlan([], True, mode, "get_weather")
    whole = _assert_stream_is_message(plan, PARSERS, "Paris, three days.</think>" + answer)
    assert whole["reasoning_content"] == "Paris, three days."
    if mode == "none":
        assert whole["content"] == answer and "tool_calls" not in whole
        return
    assert whole["content"] is None
    (call,) = whole["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}


def test_a_named_call_cut_inside_its_reasoning_is_an_empty_call():
    message, folded = _read(ChatPlan([], True, "named", "f"), PARSERS, ["still thinking"])
    assert message["reasoning_content"] == "still thinking"
    assert message["tool_calls"][0]["function"] == {"name": "f", "arguments": ""}
    assert folded["tool_calls"][0]["name"] == "f"


def test_a_value_nested_too_deep_to_parse_comes_back_as_content():
    deep = "[" * 50_000 + "]" * 50_000
    text = ('\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="f">\n<｜DSML｜parameter name="x" '
            f'string="false">{deep}</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>')
    message, _ = _read(ChatPlan([], False, "auto"), PARSERS, [text])
    # the call had started (its name was read): it stays, without the value
    assert [c["function"] for c in message["tool_calls"]] == [{"name": "f", "arguments": "{}"}]
    assert deep in message["content"]


# -- a long output: what a step adds to a choice costs the same at its end -----------------

@pytest.mark.parametrize(("mode", "thinking", "piece"), [
    ("none", False, "some content, "),
    ("auto", True, "a long thought "),
    ("named", False, '"x", '),
    ("required", False, '{"name": "f", "parameters": {}}, ')])
def test_a_choice_takes_each_output_in_memory_that_does_not_grow_with_its_text(
        mode, thinking, piece):
    """20,000 outputs into one chat choice: the last adds allocate about what the early
    ones do (a copy of the text so far would be some 300 kB by then)."""
    state = ChoiceState(0, 1, reader=ChatOutput(ChatPlan([], thinking, mode, "f"), PARSERS))
    peaks: dict[int, int] = {}
    with tracing():
        for at in range(20_000):
            out = RequestOutput("r", [], IdsSnapshot([]), [7], piece, False)
            if 1000 <= at < 1200 or at >= 19_800:
                peaks[at] = peak_bytes(lambda out=out: state.add(out))
            else:
                state.add(out)
    start = statistics.median(v for k, v in peaks.items() if k < 1200)
    end = statistics.median(v for k, v in peaks.items() if k >= 19_800)
    assert end <= 2 * start + 4 * CHUNK and end < 16_000, (start, end)
    assert len(state.text) == 20_000 * len(piece)


def test_a_thinking_constrained_request_reasons_first_then_meets_its_constraint(v4, tiny):
    person = {"type": "json_schema", "json_schema": {"name": "p", "schema": {
        "type": "object", "properties": {"name": {"type": "string"}}}}}
    for tokenizer, end_id in ((v4, v4.token_id("</think>")), (tiny, None)):
        plan = chat.plan(tokenizer, _request(response_format=person, thinking_token_budget=7,
                                             thinking={"type": "enabled"}), PARSERS)
        assert plan.thinking and plan.structured.json is not None
        assert plan.structured.reasoning == Reasoning("</think>", end_id, 7)
    required = chat.plan(v4, _request(tools=[WEATHER], tool_choice="required",
                                      thinking={"type": "enabled"}), PARSERS)
    assert required.thinking and required.structured.reasoning.budget is None


def test_a_reasoning_budget_alone_constrains_only_the_reasoning(v4):
    plan = chat.plan(v4, _request(thinking={"type": "enabled"}, thinking_token_budget=0),
                     PARSERS)
    assert plan.structured == StructuredOutputs(regex=ANYTHING, reasoning=Reasoning(
        "</think>", v4.token_id("</think>"), 0))
    assert chat.plan(v4, _request(thinking_token_budget=5), PARSERS).structured is None
    for bad in (-1, 2**31, 2**64):
        with pytest.raises(ValidationError):
            _request(thinking_token_budget=bad)
    assert chat.plan(v4, _request(thinking={"type": "enabled"},
                                  thinking_token_budget=2**31 - 1), PARSERS).structured


@pytest.mark.parametrize("defaults, body, thinking", [
    ({"thinking": True}, {}, True),
    ({"thinking": True}, {"chat_template_kwargs": {"thinking": False}}, False),
    ({"enable_thinking": True}, {"thinking": {"type": "disabled"}}, False),
    ({}, {"chat_template_kwargs": {"thinking": True}}, True),
])
def test_default_chat_template_kwargs_sit_under_the_requests_own(v4, defaults, body, thinking):
    options = ChatOptions("deepseek_v4", default_chat_template_kwargs=defaults)
    assert chat.plan(v4, _request(**body), options).thinking is thinking


def test_an_agent_loops_reasoning_reaches_the_prompt_through_the_request(v4):
    """A conversation with tools, an earlier call, its result and a new question, as a
    client sends it: every assistant turn's reasoning_content is in the prompt."""
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "reasoning_content": "Call the tool.",
         "tool_calls": [{"id": "c1", "type": "function", "function": {
             "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sun"},
        {"role": "assistant", "content": "Sunny.", "reasoning_content": "It is sunny."},
        {"role": "user", "content": "And tomorrow?"}]
    plan = chat.plan(v4, _request(messages=messages, tools=[WEATHER],
                                  thinking={"type": "enabled"}), PARSERS)
    prompt = v4.decode(plan.prompt_ids, skip_special_tokens=False)
    assert "<think>Call the tool.</think>" in prompt and "<think>It is sunny.</think>" in prompt
    assert "<tool_result>sun</tool_result>" in prompt and prompt.endswith("<think>")
