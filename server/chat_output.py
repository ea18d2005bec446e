"""One chat choice's generated text read as an assistant message, whole or as deltas.

feed(text, final) takes each piece of text the engine releases and returns the delta it
makes (OpenAI's chunk shape: `reasoning_content`, `content`, `tool_calls[i]` with the
call's id, type and name on its first fragment); with the last piece (final) it also
releases what was held back. The deltas of any run concatenate to message(): a stream
says what the whole response says.

By the plan's tool mode:
    named     the text is the function's arguments, streamed as they come
    required  the text is a JSON array of calls (server/call_array.py), each call's name
              first, then its arguments as they are written (text that leaves the array
              comes back as content)
    auto      DSML calls (in the chat format's tags: V4's or V4.1's) are parsed out of
              the content (server/v4_output.py), each call's name first, then its
              arguments in fragments as they are read
    none      the text is content
and the reasoning parser, when on and the prompt opened a thinking block, splits the
reasoning off first. Calls are read after the reasoning only (where the request's grammar
holds them to its tools), name one of the request's tools, and are one at most without
parallel calls; each reader's work is linear in the output.
"""
from __future__ import annotations

import secrets

from runtime.text.growing_text import GrowingText
from server.call_array import CallArray
from server.chat import FORMATS, ChatOptions, ChatPlan
from server.v4_output import Parsed, V4OutputParser


def call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


class ChatOutput:
    def __init__(self, plan: ChatPlan, options: ChatOptions):
        self.mode, self.name = plan.tool_mode, plan.tool_name
        self.reasoning = bool(options.reasoning_parser) and plan.thinking
        self.parser = None
        calls = self.mode == "auto" and plan.read_calls
        if self.mode in ("auto", "none") and (self.reasoning or calls):
            # without a reasoning parser the reasoning is content, but holds no calls
            self.parser = V4OutputParser(reasoning=plan.thinking, split=self.reasoning,
                                         tools=calls, names=plan.tool_names,
                                         parallel=plan.parallel,
                                         markup=FORMATS[options.chat_format].markup)
        self.array = CallArray(plan.tool_names, plan.parallel) \
            if self.mode == "required" else None
        # named, required: the reasoning comes off first, the rest is the calls' text
        self.thought = V4OutputParser(reasoning=True, tools=False) \
            if self.reasoning and self.mode in ("named", "required") else None
        # appended to per feed, joined by message(): a feed costs O(its text)
        self._reasoning, self._content = GrowingText(), GrowingText()
        self._arguments = GrowingText()        # named: the one call's arguments
        self.calls: list[dict] = []            # OpenAI tool calls (named: see message)
        self._pieces: list[GrowingText] = []   # auto, required: each call's arguments

    def feed(self, text: str, final: bool = False) -> dict:
        """The delta `text` makes; `final`: the output ended with it (release the rest)."""
        delta = self._feed(text)
        return _merged(delta, self._finish()) if final else delta

    @property
    def content(self) -> str:
        return str(self._content)

    @property
    def reasoning_text(self) -> str:
        return str(self._reasoning)

    def _feed(self, text: str) -> dict:
        if self.thought is not None:
            return self._after_thought(self.thought.feed(text))
        if self.mode == "named":
            return self._argument(text)
        if self.mode == "required":
            return self._required(text)
        if self.parser is None:
            return self._delta(Parsed(content=text))
        return self._delta(self.parser.feed(text))

    def _finish(self) -> dict:
        delta = {}
        if self.thought is not None:
            delta = self._after_thought(self.thought.finish(), final=True)
        if self.mode == "required":
            return _merged(delta, self._leftover())
        if self.parser is None:
            return delta
        return self._delta(self.parser.finish())

    def _after_thought(self, parsed: Parsed, final: bool = False) -> dict:
        """Named or required with reasoning: the reasoning's delta, then the delta of
        the text after it as the mode reads it (a named call starts with that text)."""
        delta = self._delta(Parsed(reasoning=parsed.reasoning))
        if parsed.content or (final and self.mode == "named" and not self.calls):
            text = parsed.content
            delta = _merged(delta, self._argument(text) if self.mode == "named"
                            else self._required(text))
        return delta

    def message(self) -> dict:
        if self.mode == "named" and self.calls:          # its arguments, joined here
            self.calls[0]["function"]["arguments"] = str(self._arguments)
        if self.mode in ("auto", "required"):
            for call, pieces in zip(self.calls, self._pieces):
                call["function"]["arguments"] = str(pieces)
        content = self.content
        message = {"role": "assistant", "content": content if content or not self.calls
                   else None}
        if self.reasoning:
            message["reasoning_content"] = self.reasoning_text
        if self.calls:
            message["tool_calls"] = self.calls
        return message

    def finish_reason(self, reason: str | None) -> str | None:
        """A response that calls tools ends with "tool_calls" (unless cut by length)."""
        return "tool_calls" if self.calls and reason == "stop" else reason

    # -- pieces ----------------------------------------------------------------------

    def _delta(self, parsed: Parsed) -> dict:
        delta = {}
        if parsed.reasoning:
            self._reasoning.append(parsed.reasoning)
            delta["reasoning_content"] = parsed.reasoning
        if parsed.content:
            self._content.append(parsed.content)
            delta["content"] = parsed.content
        calls = [self._call(c.name, c.arguments) if c.name is not None
                 else self._more(c.index, c.arguments) for c in parsed.tool_calls]
        if calls:
            delta["tool_calls"] = calls
        return delta

    def _call(self, name: str, arguments: str) -> dict:
        """A new call: its first fragment carries its id, type and name."""
        call = {"id": call_id(), "type": "function",
                "function": {"name": name, "arguments": arguments}}
        self.calls.append(call)
        self._pieces.append(GrowingText())
        self._pieces[-1].append(arguments)
        return {"index": len(self.calls) - 1, **call,
                "function": dict(call["function"])}

    def _more(self, index: int, arguments: str) -> dict:
        """A later fragment of call `index`'s arguments (joined by message())."""
        self._pieces[index].append(arguments)
        return {"index": index, "function": {"arguments": arguments}}

    def _argument(self, text: str) -> dict:
        """The named function's arguments grow by text (its call's "arguments" is set
        from them when message() is read)."""
        self._arguments.append(text)
        if not self.calls:
            return {"tool_calls": [self._call(self.name, text)]}
        if not text:
            return {}
        return {"tool_calls": [{"index": 0, "function": {"arguments": text}}]}

    def _required(self, text: str) -> dict:
        """The calls of the JSON array `[call, call, ...]`, as they are read."""
        return self._delta(self.array.feed(text))

    def _leftover(self) -> dict:
        """The output ended: what the array reader held back (text of an object never
        named, or not an array at all, comes back as content)."""
        return self._delta(self.array.finish())


def _merged(delta: dict, more: dict) -> dict:
    """Two deltas in order as one: text joined, tool-call fragments listed."""
    for key, value in more.items():
        delta[key] = delta.get(key, type(value)()) + value
    return delta
