"""The DSML tags of DeepSeek's chat formats: V4's and V4.1's.

A tool-calls block is written alike in both; V4.1 puts a space before each tag's name
and calls the block "calls" (its encoding/encoding.py: tool_calls_block_name " calls",
tool_call_tag_name " invoke", tool_parameter_tag_name " parameter"):

    V4                                            V4.1
    <｜DSML｜tool_calls>                           <｜DSML｜ calls>
    <｜DSML｜invoke name="N">                      <｜DSML｜ invoke name="N">
    <｜DSML｜parameter name="K" string="true">V     <｜DSML｜ parameter name="K" string="true">V
      </｜DSML｜parameter>                           </｜DSML｜ parameter>
    </｜DSML｜invoke>                              </｜DSML｜ invoke>
    </｜DSML｜tool_calls>                          </｜DSML｜ calls>

"｜DSML｜" is one added token in both vocabularies; the tag name after it is text. The
encoders write a block after "\\n\\n", which belongs to its opening delimiter.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

DSML = "｜DSML｜"


@dataclass(frozen=True)
class Markup:
    """One format's tag names, and the delimiters the parser and the encoders write
    (derived once: the parser reads them on every step)."""

    calls: str                 # the block's tag name: "tool_calls" (V4), " calls" (V4.1)
    invoke: str
    parameter: str
    calls_open: str = field(init=False)        # "<｜DSML｜tool_calls" (its ">" follows)
    calls_close: str = field(init=False)
    calls_start: str = field(init=False)       # "\n\n" + calls_open, as the encoder writes it
    invoke_open: str = field(init=False)       # up to the name's opening quote
    invoke_close: str = field(init=False)
    param_open: str = field(init=False)
    param_close: str = field(init=False)
    json_stop: re.Pattern = field(init=False)  # in a JSON value: a string's quote, or its end

    def __post_init__(self) -> None:
        derived = {
            "calls_open": f"<{DSML}{self.calls}", "calls_close": f"</{DSML}{self.calls}>",
            "calls_start": f"\n\n<{DSML}{self.calls}",
            "invoke_open": f'<{DSML}{self.invoke} name="',
            "invoke_close": f"</{DSML}{self.invoke}>",
            "param_open": f'<{DSML}{self.parameter} name="',
            "param_close": f"</{DSML}{self.parameter}>"}
        derived["json_stop"] = re.compile('"|' + re.escape(derived["param_close"]))
        for name, value in derived.items():
            object.__setattr__(self, name, value)


V4 = Markup("tool_calls", "invoke", "parameter")
V41 = Markup(" calls", " invoke", " parameter")
