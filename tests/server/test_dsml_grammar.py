"""The auto-mode grammar (server/dsml_grammar.py) through llguidance, on both kinds of
vocabulary: "｜DSML｜" as one added token (a V4 vocabulary) and as text (the embedded model)."""
from __future__ import annotations

import json

import pytest

from runtime.text.grammar import GrammarError, StructuredOutputs, Vocabulary
from runtime.text.tokenizer import Tokenizer
from server import v4_encoding
from server.dsml_grammar import DsmlGrammar
from server.v4_encoding import DSML
from tests.conftest import REPO
from tests.server.v4_tokenizer import write_v4_tokenizer

WEATHER = {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"},
    "days": {"type": "integer", "minimum": 1, "maximum": 7},
    "where": {"type": "object", "properties": {"lat": {"type": "number"}},
              "required": ["lat"], "additionalProperties": False},
    "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "days"]}}
CLOCK = {"name": "get_time"}                    # no parameters schema: any parameters


def _param(key: str, value: str, text: bool = True) -> str:
    kind = "true" if text else "false"
    return f'<{DSML}parameter name="{key}" string="{kind}">{value}</{DSML}parameter>'


def _block(*invokes: tuple[str, list[str]]) -> str:
    calls = "\n".join(f'<{DSML}invoke name="{name}">\n' + "\n".join(params)
                      + f"\n</{DSML}invoke>" for name, params in invokes)
    return f"\n\n<{DSML}tool_calls>\n{calls}\n</{DSML}tool_calls>"


PARIS = ("get_weather", [_param("city", 'Paris "centre" <b>'), _param("days", "3", False)])


@pytest.fixture(scope="module", params=["token", "text"])
def vocab(request, tmp_path_factory) -> tuple[Tokenizer, Vocabulary, int | None]:
    if request.param == "token":
        tok = Tokenizer(write_v4_tokenizer(tmp_path_factory.mktemp("v4")))
        return tok, Vocabulary(tok.path, tok.vocab_size + 8, tok.eos_id), tok.token_id(DSML)
    tok = Tokenizer(REPO / "models" / "tiny")
    return tok, Vocabulary(tok.path, tok.vocab_size + 40, tok.eos_id), None


def _takes(vocab, text: str, tools=(WEATHER, CLOCK), parallel: bool = True) -> bool:
    """Whether the grammar takes `text` as a whole output."""
    tok, voc, dsml = vocab
    grammar = DsmlGrammar([dict(t) for t in tools], dsml, parallel).lark()
    matcher = voc.matcher(StructuredOutputs(grammar=grammar))
    ids = tok.encode(text, add_special_tokens=False)
    return all(matcher.consume_token(t) for t in ids) and matcher.is_accepting()


@pytest.mark.parametrize("text", [
    "",
    "No call needed: 2 < 3 and </b> is markup.",
    "Let me check." + _block(PARIS),
    "Two calls." + _block(PARIS, ("get_time", [_param("zone", "UTC")])) + " Done.",
    _block(("get_weather", [_param("city", "Oslo"), _param("days", "1", False),
                            _param("where", '{"lat": 59.9}', False),
                            _param("unit", "celsius")])),
    _block(("get_time", [])),
    _block(("get_time", [_param("tz", '{"offset": [1, 2]}', False)])),
])
def test_free_text_and_well_formed_calls_are_taken(vocab, text):
    assert _takes(vocab, text)


@pytest.mark.parametrize("text", [
    _block(("get_date", [])),                                        # not a tool
    _block(("get_weather", [_param("city", "Oslo")])),               # days is required
    _block(("get_weather", [_param("city", "Oslo"), _param("days", "9", False)])),
    _block(("get_weather", [_param("city", "Oslo"), _param("days", '"3"', False)])),
    _block(("get_weather", [_param("days", "3", False), _param("city", "Oslo")])),  # order
    _block(("get_weather", [_param("city", "Oslo"), _param("days", "2", False),
                            _param("where", '{"lat": 1, "x": 2}', False)])),
    _block(("get_weather", [_param("city", "Oslo"), _param("city", "Rome"),
                            _param("days", "2", False)])),             # a repeat
    "Unclosed" + _block(PARIS)[:-5],
    _block(("get_weather", [_param("city", "Oslo"), _param("days", "2", False),
                            _param("unit", "kelvin")])),                # not in the enum
])
def test_a_call_the_tools_do_not_allow_is_refused(vocab, text):
    assert not _takes(vocab, text)


def test_without_parallel_calls_a_block_holds_one_call(vocab):
    two = _block(PARIS, ("get_time", []))
    assert _takes(vocab, two) and not _takes(vocab, two, parallel=False)
    assert _takes(vocab, _block(PARIS), parallel=False)


def test_the_released_encoders_calls_are_taken(vocab):
    """An assistant turn with calls, as the format renders it, is an output the grammar
    takes (the markup the model learned is the markup it may write)."""
    message = {"role": "assistant", "content": "Checking.", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": json.dumps(
            {"city": "Rome", "days": 2, "where": {"lat": 41.9}, "unit": "celsius"})}},
        {"type": "function", "function": {"name": "get_time", "arguments": "{}"}}]}
    prompt = v4_encoding.encode([{"role": "user", "content": "Hi"}, message], thinking=False)
    output = prompt[prompt.index("Checking."):prompt.rindex(v4_encoding.EOS)]
    assert _takes(vocab, output)


def test_without_schemas_the_grammar_holds_the_names_only(vocab):
    """The fallback of a request whose tool schemas do not compile: any parameters, but
    only the tools' names."""
    tok, voc, dsml = vocab
    broken = {"name": "f", "parameters": {"type": "object", "properties": {
        "x": {"type": "integer", "minimum": 5, "maximum": 1}}}}
    with pytest.raises(GrammarError, match="minimum"):
        voc.check(StructuredOutputs(grammar=DsmlGrammar([broken], dsml).lark()))
    names = StructuredOutputs(grammar=DsmlGrammar([broken], dsml, schemas=False).lark())
    for text, taken in ((_block(("f", [_param("x", "3", False)])), True),
                        (_block(("g", [])), False)):
        matcher = voc.matcher(names)
        ids = tok.encode(text, add_special_tokens=False)
        assert (all(matcher.consume_token(t) for t in ids) and matcher.is_accepting()) is taken
