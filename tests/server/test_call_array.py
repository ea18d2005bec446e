"""Reading tool calls as they are written, in linear time: the JSON array of
tool_choice "required" (server/call_array.py) at every split of its text, its arguments
streamed as the model writes them, and the work of every mode's reader (required, named,
auto) on a call of 200 KB fed a token at a time."""
from __future__ import annotations

import json
import time

import pytest

from server.call_array import CallArray
from server.chat import ChatOptions, ChatPlan
from server.chat_output import ChatOutput
from server.v4_output import CallPiece, Parsed

PARSERS = ChatOptions("deepseek_v4", "deepseek_v4", True)
TOOLS = ("get_weather", "get_time", "f")
WEATHER = '{"city": "Paris \\"centre\\" {x} [y] \\\\", "n": [1, {"a": null}], "t": true}'


def read(text: str, pieces: list[str] | None = None, names=TOOLS,
         parallel: bool = True) -> tuple[str, list[tuple[str, str]], list[CallPiece]]:
    """(content, [(name, arguments)], the pieces) of `text` fed in `pieces`."""
    array = CallArray(names, parallel)
    outs = [array.feed(p) for p in (pieces if pieces is not None else [text])]
    outs.append(array.finish())
    got = [p for o in outs for p in o.tool_calls]
    calls: list[list[str]] = []
    for piece in got:
        if piece.name is not None:
            assert piece.index == len(calls)
            calls.append([piece.name, piece.arguments])
        else:
            assert piece.index == len(calls) - 1
            calls[-1][1] += piece.arguments
    return "".join(o.content for o in outs), [tuple(c) for c in calls], got


CASES = {
    "two calls, the second's name last": (
        f'[{{"name": "get_weather", "parameters": {WEATHER}}}, '
        '{"parameters": {"z": -1.5e3}, "name": "get_time"}]',
        "", [("get_weather", WEATHER), ("get_time", '{"z": -1.5e3}')]),
    "whitespace anywhere": (
        '\n[ {\n"name" : "f" ,\t"parameters" : { "a" : [ ] } } ]\n',
        "", [("f", '{ "a" : [ ] }')]),
    "scalar and string arguments": (
        '[{"name": "f", "parameters": 12}, {"name": "f", "parameters": "a\\"}]"}]',
        "", [("f", "12"), ("f", '"a\\"}]"')]),
    "no parameters": ('[{"name": "get_time"}]', "", [("get_time", "{}")]),
    "an escaped name": ('[{"name": "get\\u005ftime", "parameters": {}}]', "",
                        [("get_time", "{}")]),
    "not an array": ("Sorry, I cannot.", "Sorry, I cannot.", []),
    "text after the array": ('[{"name": "f", "parameters": {}}] done', "] done",
                             [("f", "{}")]),
    "cut before a name": ('[{"name": "f", "parameters": {}}, {"name": "get_w',
                          '{"name": "get_w', [("f", "{}")]),
    "cut inside named arguments": ('[{"name": "f", "parameters": {"a": "b',
                                   "", [("f", '{"a": "b')]),
    "a key the schema has not": ('[{"name": "f", "parameters": {}, "x": 1}]',
                                 ', "x": 1}]', [("f", "{}")]),
    "a repeated name": ('[{"name": "f", "name": "g", "parameters": {}}]',
                        ', "name": "g", "parameters": {}}]', [("f", "")]),
    "an object without a name": ('[{"parameters": {"a": 1}}]', '[{"parameters": {"a": 1}}]',
                                 []),
    # hostile: a call to a tool the request did not declare is not read
    "an undeclared tool": ('[{"name": "rm_rf", "parameters": {"path": "/"}}]',
                           '[{"name": "rm_rf", "parameters": {"path": "/"}}]', []),
    "an undeclared tool after a declared one": (
        '[{"name": "f", "parameters": {}}, {"parameters": {"p": 1}, "name": "rm_rf"}]',
        ', {"parameters": {"p": 1}, "name": "rm_rf"}]', [("f", "{}")]),
}


@pytest.mark.parametrize("name", CASES)
def test_the_array_reads_the_same_at_every_split(name):
    text, content, calls = CASES[name]
    whole = read(text)
    assert whole[:2] == (content, calls)
    for cut in range(len(text) + 1):
        assert read(text, [text[:cut], text[cut:]])[:2] == whole[:2], cut
    assert read(text, list(text))[:2] == whole[:2]


def test_without_parallel_calls_one_call_is_read():
    text = '[{"name": "f", "parameters": {}}, {"name": "get_time", "parameters": {"a": 1}}]'
    assert read(text, parallel=False)[:2] == (
        ', {"name": "get_time", "parameters": {"a": 1}}]', [("f", "{}")])
    for cut in range(len(text) + 1):
        assert read(text, [text[:cut], text[cut:]], parallel=False)[1] == [("f", "{}")]


def test_arguments_stream_as_the_model_writes_them():
    """Fed a character at a time, a call is named once its name's string closes, and its
    arguments come in pieces as they are written, the last with the value's end."""
    text = f'[{{"name": "get_weather", "parameters": {WEATHER}}}]'
    seen: list[tuple[int, CallPiece]] = []
    array = CallArray(TOOLS)
    for at, char in enumerate(text):
        seen += [(at, p) for p in array.feed(char).tool_calls]
    assert array.finish() == Parsed()
    assert seen[0] == (text.index('",'), CallPiece(0, "get_weather", ""))
    released = {at for at, _ in seen[1:]}
    waited = set(range(text.index(WEATHER), text.rindex("}"))) - released
    assert waited and all(text[at] == "\\" for at in waited)    # the escape's next comes
    assert "".join(p.arguments for _, p in seen) == WEATHER


def _fold(plan: ChatPlan, pieces: list[str]) -> tuple[dict, dict]:
    """(the message, the streamed deltas folded per call) of one output."""
    output = ChatOutput(plan, PARSERS)
    calls: dict[int, list[str]] = {}
    content = ""
    for n, piece in enumerate(pieces):
        delta = output.feed(piece, final=n == len(pieces) - 1)
        content += delta.get("content", "")
        for call in delta.get("tool_calls", []):
            if "id" in call:
                calls[call["index"]] = [call["function"]["name"], ""]
            calls[call["index"]][1] += call["function"]["arguments"]
    return output.message(), {"content": content, "calls": list(calls.values())}


@pytest.mark.parametrize("name", ["two calls, the second's name last", "cut before a name",
                                  "an undeclared tool after a declared one"])
def test_required_mode_streams_what_the_whole_response_says(name):
    text, content, calls = CASES[name]
    plan = ChatPlan([], False, "required", tool_names=TOOLS)
    for pieces in ([text], *([text[:c], text[c:]] for c in range(len(text) + 1))):
        message, streamed = _fold(plan, pieces)
        got = [(c["function"]["name"], c["function"]["arguments"])
               for c in message.get("tool_calls", [])]
        assert got == [tuple(c) for c in streamed["calls"]] == calls
        assert (message["content"] or "") == streamed["content"] == content


# -- linear work: a long call fed a token at a time -----------------------------------------

def _call_text(mode: str, size: int) -> str:
    """An output of `mode` whose one call's arguments are about `size` characters."""
    items = ", ".join(f'{{"k{i}": "v}}]\\"{i}"}}' for i in range(size // 16))
    arguments = f'{{"items": [{items}]}}'
    if mode == "named":
        return arguments
    if mode == "required":
        return f'[{{"name": "f", "parameters": {arguments}}}]'
    return ("Calling.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n"
            f'<｜DSML｜parameter name="items" string="false">{arguments[10:-1]}'
            '</｜DSML｜parameter>\n<｜DSML｜parameter name="note" string="true">'
            + "a}b " * (size // 8) + "</｜DSML｜parameter>\n</｜DSML｜invoke>\n"
            "</｜DSML｜tool_calls>")


def _seconds(mode: str, size: int) -> float:
    """The best of three runs of one choice's reader over the output, 4 characters a
    feed (a token's worth), checking the arguments it streams join to its message's."""
    text = _call_text(mode, size)
    plan = ChatPlan([], False, mode, "f", tool_names=TOOLS)
    best = float("inf")
    for _ in range(3):
        output, streamed = ChatOutput(plan, PARSERS), []
        start = time.perf_counter()
        for at in range(0, len(text), 4):
            delta = output.feed(text[at:at + 4], final=at + 4 >= len(text))
            streamed += [c["function"]["arguments"] for c in delta.get("tool_calls", [])]
        best = min(best, time.perf_counter() - start)
        (call,) = output.message()["tool_calls"]
        assert "".join(streamed) == call["function"]["arguments"]
        assert len(streamed) > size // 8            # streamed as written, not in one piece
        json.loads(call["function"]["arguments"])
    return best


@pytest.mark.parametrize("mode", ["required", "named", "auto"])
def test_a_long_call_is_read_in_time_linear_in_its_length(mode):
    """20 KB and 200 KB of arguments: ten times the text takes about ten times the time
    (a reader that reads its text again per token would take about a hundred)."""
    small, large = _seconds(mode, 20_000), _seconds(mode, 200_000)
    assert large < 25 * small, (mode, small, large)
