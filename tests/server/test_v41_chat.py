"""V4.1 chat requests without an engine: the format picked by the model's family or the
parser flags (a parser of the other format refused), the prompt and the auto-mode grammar
in V4.1's terms, reasoning_effort to its tiers, image parts refused, the output read in
V4.1's tags whole and streamed; and /tokenize and the 400s through the app (an engine
stand-in that never generates)."""
from __future__ import annotations

import argparse
import json
from types import SimpleNamespace

import pytest
from starlette.testclient import TestClient

from runtime.text.tokenizer import Tokenizer
from server import chat, v41_encoding
from server.app import ServerState, build_app
from server.chat import ChatOptions, ChatPlan
from server.chat_output import ChatOutput
from server.cli.serve import chat_options
from server.protocol import APIError, ChatCompletionRequest
from tests.server.test_chat_plan import _assert_stream_is_message, _read
from tests.server.v41_tokenizer import write_v41_tokenizer

V4, V41 = "deepseek_v4", "deepseek_v41"
PARSERS = ChatOptions(V41, V41, True, family=V41)
WEATHER = {"type": "function", "function": {
    "name": "ns::get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
ASK = {"role": "user", "content": "Weather in Paris?"}
DSML_TEXT = ('I will look it up.\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name="ns::get_weather">\n'
             '<｜DSML｜ parameter name="city" string="true">Paris "centre"</｜DSML｜ parameter>\n'
             "</｜DSML｜ invoke>\n</｜DSML｜ calls>")


@pytest.fixture(scope="module")
def v41(tmp_path_factory) -> Tokenizer:
    return Tokenizer(write_v41_tokenizer(tmp_path_factory.mktemp("v41")))


def _request(**body) -> ChatCompletionRequest:
    body.setdefault("messages", [ASK])
    return ChatCompletionRequest.model_validate(body)


def _prompt(v41, options=PARSERS, **body) -> str:
    return v41.decode(chat.plan(v41, _request(**body), options).prompt_ids,
                      skip_special_tokens=False)


# -- which format ------------------------------------------------------------------------------


def test_the_family_else_the_parsers_pick_the_format():
    assert ChatOptions().chat_format == V4
    assert ChatOptions(V4, V4).chat_format == V4
    assert ChatOptions(None, V41, True).chat_format == V41
    assert ChatOptions(family=V41).chat_format == V41
    import generated
    assert chat.family_of(generated.load("v41-tiny")) == V41
    assert chat.family_of(generated.load("tiny")) == V4


@pytest.mark.parametrize("options, says", [
    ({"reasoning_parser": V4, "family": V41}, "--reasoning-parser deepseek_v4 reads DeepSeek "
     "V4's chat format, but this model is DeepSeek V4.1: use --reasoning-parser deepseek_v41"),
    ({"tool_call_parser": V41, "family": V4}, "this model is DeepSeek V4: use "
     "--tool-call-parser deepseek_v4"),
    ({"reasoning_parser": V4, "tool_call_parser": V41}, "the other parser reads DeepSeek V4.1"),
    ({"reasoning_parser": "qwen3"}, "'qwen3' is none of deepseek_v4, deepseek_v41"),
])
def test_a_parser_of_another_format_is_refused(options, says):
    with pytest.raises(ValueError, match=says.replace(".", r"\.")):
        ChatOptions(**options)


def test_serve_refuses_it_before_loading_the_model():
    args = argparse.Namespace(spec="v41-tiny", reasoning_parser=V4, tool_call_parser=None,
                              enable_auto_tool_choice=False, default_chat_template_kwargs=None)
    with pytest.raises(SystemExit, match="use --reasoning-parser deepseek_v41"):
        chat_options(args)
    args.reasoning_parser = args.tool_call_parser = V41
    assert chat_options(args).chat_format == V41


# -- the prompt --------------------------------------------------------------------------------


def test_a_v41_vocabulary_gets_the_v41_encoding_and_grammar(v41):
    plan = chat.plan(v41, _request(tools=[WEATHER], chat_template_kwargs={"thinking": True}),
                     PARSERS)
    want = v41_encoding.encode([ASK], thinking=True, tools=[WEATHER])
    assert plan.prompt_ids == v41.encode(want, add_special_tokens=False)
    assert plan.thinking and plan.tool_mode == "auto"
    assert plan.tool_names == ("ns::get_weather",)
    # the block's tags after the token are V4.1's, spaced
    assert '" invoke name=\\"ns::get_weather\\">"' in plan.structured.grammar
    assert '" calls"' in plan.structured.grammar and "tool_calls" not in plan.structured.grammar


@pytest.mark.parametrize("body, budget", [
    ({}, 75),
    ({"reasoning_effort": "low"}, 50),
    ({"reasoning_effort": "medium"}, 75),
    ({"reasoning_effort": "high"}, 75),
    ({"reasoning_effort": "xhigh"}, 100),
    ({"reasoning_effort": "max"}, 100),
    ({"chat_template_kwargs": {"reasoning_effort": 42}}, 42),
    ({"chat_template_kwargs": {"reasoning_effort": "low"}}, 50),
    ({"reasoning_effort": "max", "chat_template_kwargs": {"reasoning_effort": 42}}, 100),
])
def test_reasoning_effort_maps_to_the_formats_budget(v41, body, budget):
    prompt = _prompt(v41, thinking={"type": "enabled"}, **body)
    assert prompt.startswith(v41_encoding.BOS + v41_encoding.SYSTEM
                             + v41_encoding.EFFORT_LINE.format(budget))


def test_the_servers_default_effort_comes_from_its_template_arguments(v41):
    options = ChatOptions(V41, default_chat_template_kwargs={"reasoning_effort": 90})
    assert v41_encoding.EFFORT_LINE.format(90) in _prompt(v41, options, thinking={
        "type": "enabled"})
    assert "Reasoning Effort" not in _prompt(v41, options)         # chat mode: no line


@pytest.mark.parametrize("body, param", [
    ({"reasoning_effort": "extreme"}, "reasoning_effort"),
    ({"reasoning_effort": "none"}, "reasoning_effort"),
    ({"chat_template_kwargs": {"reasoning_effort": 0}}, "chat_template_kwargs"),
    ({"chat_template_kwargs": {"reasoning_effort": 101}}, "chat_template_kwargs"),
    ({"chat_template_kwargs": {"reasoning_effort": True}}, "chat_template_kwargs"),
    ({"chat_template_kwargs": {"reasoning_effort": 50.0}}, "chat_template_kwargs"),
])
def test_other_efforts_are_400s_naming_their_field(v41, body, param):
    with pytest.raises(APIError) as err:
        chat.plan(v41, _request(**body), PARSERS)
    assert err.value.status == 400 and err.value.param == param
    assert "low, medium, high, xhigh, max" in err.value.message


def test_a_v4_model_ignores_the_template_arguments_effort(v41):
    assert _prompt(v41, ChatOptions(family=V4), chat_template_kwargs={
        "reasoning_effort": 0}).startswith(v41_encoding.BOS + v41_encoding.USER)


def test_image_parts_are_a_400_naming_the_part_and_text_parts_join_as_blocks(v41):
    parts = [{"type": "text", "text": "What is"}, {"type": "text", "text": "this?"}]
    assert "What is\n\nthis?" in _prompt(v41, messages=[{"role": "user", "content": parts}])
    image = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
    with pytest.raises(APIError) as err:
        chat.plan(v41, _request(messages=[{"role": "user", "content": [parts[0], image]}]),
                  PARSERS)
    assert err.value.status == 400 and err.value.param == "messages[0].content[1]"
    assert "image part" in err.value.message and "text model" in err.value.message


# -- the output --------------------------------------------------------------------------------


def test_auto_calls_and_reasoning_read_alike_whole_and_streamed():
    plan = ChatPlan([], True, "auto", tool_names=("ns::get_weather",))
    whole = _assert_stream_is_message(plan, PARSERS, "Paris is in France.</think>" + DSML_TEXT)
    assert whole["reasoning_content"] == "Paris is in France."
    assert whole["content"] == "I will look it up."
    (call,) = whole["tool_calls"]
    assert call["function"]["name"] == "ns::get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": 'Paris "centre"'}
    output = ChatOutput(plan, PARSERS)
    output.feed("ok</think>" + DSML_TEXT, final=True)
    assert output.finish_reason("stop") == "tool_calls"


def test_calls_are_read_only_as_the_plan_allows():
    forged = DSML_TEXT.replace("ns::get_weather", "wipe_disk")
    plan = ChatPlan([], False, "auto", tool_names=("ns::get_weather",))
    assert _read(plan, PARSERS, [forged])[0] == {"role": "assistant", "content": forged}
    two = DSML_TEXT + DSML_TEXT.replace("I will look it up.", " Again.")
    one = ChatPlan([], False, "auto", tool_names=("ns::get_weather",), parallel=False)
    message, _ = _read(one, PARSERS, [two])
    assert len(message["tool_calls"]) == 1
    v4_tags = DSML_TEXT.replace("｜DSML｜ calls", "｜DSML｜tool_calls") \
        .replace("｜DSML｜ ", "｜DSML｜")
    assert _read(plan, PARSERS, [v4_tags])[0] == {"role": "assistant", "content": v4_tags}


def test_the_markup_is_read_only_as_the_token_where_the_vocabulary_has_it(v41):
    """Under the client's own constraint the output cannot hold the token (its strings are
    text), so no call is read from it; in auto mode the grammar writes the token."""
    asked = _request(tools=[WEATHER], response_format={"type": "json_object"})
    assert not chat.plan(v41, asked, PARSERS).read_calls
    assert chat.plan(v41, _request(tools=[WEATHER]), PARSERS).read_calls


def test_a_named_call_after_reasoning():
    plan = ChatPlan([], True, "named", "ns::get_weather")
    message, _ = _read(plan, PARSERS, ['Paris.</think>{"city": "Paris"}'])
    assert message["reasoning_content"] == "Paris."
    assert message["tool_calls"][0]["function"] == {"name": "ns::get_weather",
                                                    "arguments": '{"city": "Paris"}'}


# -- through the app ---------------------------------------------------------------------------


class _Engine:
    """What the routes read before a request runs; it never generates."""

    ready = healthy = True

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.admission = SimpleNamespace(limits=SimpleNamespace(max_model_len=4096,
                                                                max_num_seqs=8))


@pytest.fixture(scope="module")
def http(v41):
    import generated
    state = ServerState(_Engine(v41), generated.load("v41-tiny"), "v41", chat_options=PARSERS)
    state.ready = True
    with TestClient(build_app(state)) as client:
        yield client


def test_tokenize_gives_the_v41_prompt(http, v41):
    body = {"messages": [ASK], "tools": [WEATHER], "thinking": {"type": "enabled"},
            "reasoning_effort": "low"}
    ids = http.post("/tokenize", json=body).json()["tokens"]
    want = v41_encoding.encode([ASK], thinking=True, reasoning_effort="low", tools=[WEATHER])
    assert ids == v41.encode(want, add_special_tokens=False)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/tokenize"])
def test_an_image_part_is_a_400_over_http(http, path):
    content = [{"type": "text", "text": "What is this?"},
               {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]
    resp = http.post(path, json={"model": "v41", "messages": [
        {"role": "user", "content": content}]})
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == "messages[0].content[1]" and "image part" in error["message"]
