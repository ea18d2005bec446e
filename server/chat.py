"""Chat messages to a prompt: the checkpoint's chat template, or a plain fallback."""
from __future__ import annotations

from jinja2.sandbox import ImmutableSandboxedEnvironment

from runtime.tokenizer import Tokenizer
from server.protocol import ChatMessage, bad_request

FALLBACK = ("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant:{% endif %}")


def render(tokenizer: Tokenizer, messages: list[ChatMessage]) -> list[int]:
    """Token ids of the conversation, ending with the assistant's turn to speak."""
    template = tokenizer.chat_template or FALLBACK
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    try:
        text = env.from_string(template).render(
            messages=[{"role": m.role, "content": m.text()} for m in messages],
            add_generation_prompt=True,
            bos_token=tokenizer.config.get("bos_token") or "",
            eos_token=tokenizer.config.get("eos_token") or "")
    except Exception as exc:   # a template may raise on purpose (e.g. role order)
        raise bad_request(f"the chat template rejected the messages: {exc}", "messages") from None
    return tokenizer.encode(text, add_special_tokens=tokenizer.chat_template is None)
