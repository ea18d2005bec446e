"""The OpenAI-compatible HTTP API (Starlette) over an EngineClient (runtime/engine/client.py)."""
from __future__ import annotations

import asyncio
import itertools
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing
from dataclasses import dataclass, field, replace
from functools import partial
from types import ModuleType

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from runtime.core.sampling_params import SEED_MIN, InvalidParam, SamplingParams
from runtime.engine.client import EngineClient, EngineDeadError, RequestFailedError
from runtime.engine.intake import Add, Choice
from runtime.engine.output_processor import RequestOutput
from runtime.text.grammar import GrammarError, Vocabulary
from server import chat
from server.body import parse_json
from server.cache_salt import CacheSalts
from server.chat import ChatOptions
from server.chat_output import ChatOutput
from server.logprobs import ChatLogprobs, CompletionLogprobs, TokenText, dumps
from server.metrics import Metrics
from server.protocol import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
    bad_request,
    parse,
)
from server.responses import (
    ChoiceState,
    chat_chunk,
    chat_response,
    completion_chunk,
    completion_response,
    usage,
)

VERSION = "0.1.0"
log = logging.getLogger("v4serve.server")


@dataclass
class ServerState:
    engine: EngineClient
    spec: ModuleType
    model_name: str
    api_key: str | tuple[str, ...] | None = None     # a key, or several (any one admits)
    max_body_bytes: int = 8 << 20
    max_n: int | None = None          # most choices (n, best_of) per prompt; None: max_num_seqs
    max_prompts: int = 256            # most prompts of one completion request
    # most engine requests one body may start (prompts x n, prompts x best_of): vLLM's
    # VLLM_MAX_N_SEQUENCES, the most sequences one of its requests may ask for
    max_sequences: int = 16384
    prep_threads: int = 4             # threads that parse, tokenize, render and compile
    compile_process: object = None    # the background compile of missing graphs, if any
    draining: bool = False
    in_flight: int = 0
    ready: bool = False
    chat_options: ChatOptions = field(default_factory=ChatOptions)
    cache_salts: CacheSalts = field(default_factory=CacheSalts)   # server/cache_salt.py
    metrics_require_api_key: bool = False
    metrics: Metrics = field(init=False)
    ids: itertools.count = field(default_factory=itertools.count)
    _vocabulary: Vocabulary | None = field(default=None, init=False)
    _token_text: TokenText | None = field(default=None, init=False)
    _prep: ThreadPoolExecutor | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.metrics = Metrics(self.engine, self.model_name)

    async def offload(self, fn: Callable, *args):
        """fn(*args) on the preparation threads: the work a request costs before it runs
        (JSON, validation, tokenization, chat rendering, grammar compilation) grows with
        its size, and the event loop must keep every other stream flowing meanwhile."""
        if self._prep is None:
            self._prep = ThreadPoolExecutor(self.prep_threads, thread_name_prefix="v4serve-prep")
        return await asyncio.get_running_loop().run_in_executor(self._prep, partial(fn, *args))

    def vocabulary(self) -> Vocabulary:
        """The tokenizer as the grammar engine sees it (built on first use): the server
        compiles each constraint once to refuse a bad one with a 400."""
        if self._vocabulary is None:
            if self.tokenizer is None:
                raise bad_request("structured outputs need the checkpoint's tokenizer")
            self._vocabulary = Vocabulary.of(self.tokenizer, self.spec.architecture.CONFIG)
        return self._vocabulary

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def token_text(self) -> TokenText:
        """Each token's text as log-probs show it, decoded once per id."""
        if self._token_text is None:
            self._token_text = TokenText(self.tokenizer)
        return self._token_text

    @property
    def max_model_len(self) -> int:
        return self.engine.admission.limits.max_model_len

    @property
    def choice_limit(self) -> int:
        return self.max_n or self.engine.admission.limits.max_num_seqs


def build_app(state: ServerState) -> Starlette:
    routes = [
        Route("/v1/completions", _guard(state, completions), methods=["POST"]),
        Route("/v1/chat/completions", _guard(state, chat_completions), methods=["POST"]),
        Route("/v1/models", _guard(state, models), methods=["GET"]),
        Route("/tokenize", _guard(state, tokenize), methods=["POST"]),
        Route("/detokenize", _guard(state, detokenize), methods=["POST"]),
        Route("/health", lambda r: health(state), methods=["GET"]),
        Route("/version", lambda r: JSONResponse({"version": VERSION}), methods=["GET"]),
        Route("/server_info", lambda r: _info(state, r), methods=["GET"]),
        Route("/metrics", lambda r: _metrics(state, r), methods=["GET"]),
    ]
    app = Starlette(routes=routes, exception_handlers={404: _not_found, 405: _not_allowed})
    app.state.server = state
    return app


async def _not_found(request: Request, exc: Exception) -> JSONResponse:
    return _error(APIError(404, f"no route {request.url.path}", "NotFoundError"))


async def _not_allowed(request: Request, exc: Exception) -> JSONResponse:
    return _error(APIError(405, f"{request.method} is not allowed on {request.url.path}",
                           "MethodNotAllowed"))


def _error(err: APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status)


def _failed(exc: RequestFailedError) -> APIError:
    return APIError(500, str(exc), "InternalServerError")


def _authorized(request: Request, keys: str | tuple[str, ...]) -> bool:
    """The bearer token equals a key, compared with each in constant time (as bytes:
    headers arrive decoded as latin-1)."""
    given = request.headers.get("authorization", "").encode("latin-1")
    keys = (keys,) if isinstance(keys, str) else keys
    return sum(secrets.compare_digest(given, b"Bearer " + k.encode("utf-8")) for k in keys) > 0


def _guard(state: ServerState, handler):
    """Auth, draining, in-flight accounting and error shaping around an API handler."""

    async def endpoint(request: Request) -> Response:
        if state.api_key and not _authorized(request, state.api_key):
            return _error(APIError(401, "missing or wrong API key", "AuthenticationError"))
        if state.draining or not state.ready:
            return _error(APIError(503, "the server is not accepting requests",
                                   "ServiceUnavailableError"))
        if not state.engine.ready:
            return _error(APIError(503, "the engine is still loading",
                                   "ServiceUnavailableError"))
        state.in_flight += 1
        streaming = False
        try:
            response = await handler(state, request)
            streaming = isinstance(response, StreamingResponse)
            if streaming:
                response.body_iterator = _count_down(state, response.body_iterator)
            return response
        except APIError as err:
            return _error(err)
        except EngineDeadError as exc:
            return _error(APIError(503, str(exc), "ServiceUnavailableError"))
        except RequestFailedError as exc:         # this request's own processing failed
            return _error(_failed(exc))
        except InvalidParam as exc:               # the engine refused a value
            return _error(bad_request(str(exc), exc.param))
        except ValueError as exc:                 # the engine refused the request
            return _error(bad_request(str(exc)))
        except Exception as exc:  # noqa: BLE001 - a bug here must still answer in shape
            log.exception("%s %s failed", request.method, request.url.path)
            return _error(APIError(500, f"internal error: {type(exc).__name__}",
                                   "InternalServerError"))
        finally:
            if not streaming:
                state.in_flight -= 1

    return endpoint


async def _count_down(state: ServerState, body: AsyncIterator) -> AsyncIterator:
    try:
        async for chunk in body:
            yield chunk
    finally:
        state.in_flight -= 1


async def _body(state: ServerState, request: Request, model: type):
    """The request body as `model`, parsed and validated off the event loop."""
    kind = request.headers.get("content-type", "").split(";")[0].strip()
    if kind != "application/json":
        raise bad_request(f"content-type must be application/json, got {kind or 'none'!r}")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > state.max_body_bytes:
            raise bad_request(f"the request body exceeds {state.max_body_bytes} bytes")
    return await state.offload(lambda: parse(model, parse_json(bytes(body))))


def _check_model(state: ServerState, name: str | None) -> None:
    if name is not None and name != state.model_name:
        raise APIError(404, f"the model {name!r} does not exist; this server serves "
                            f"{state.model_name!r}", "NotFoundError", "model")


def _prompt_ids(state: ServerState, prompt: str | list[int], param: str = "prompt") -> list[int]:
    """Token ids of a text or token-id prompt; a bad id is a 400 naming its index
    (`param` is the field the prompt came in: "prompt", "prompt[2]", "tokens")."""
    if isinstance(prompt, str):
        if state.tokenizer is None:
            raise bad_request("this checkpoint has no tokenizer; send token ids", param)
        _check_text_size(state, prompt, param)
        return state.tokenizer.encode(prompt)
    vocab = state.spec.architecture.CONFIG["vocab_size"]
    for i, t in enumerate(prompt):
        if not 0 <= t < vocab:
            raise bad_request(f"token id {t} is outside the vocabulary [0, {vocab})",
                              f"{param}[{i}]")
    return prompt


def _check_text_size(state: ServerState, text: str, param: str,
                     limit: int | None = None) -> None:
    """A 400 for text too long to be a prompt here (more than `limit` tokens, by default
    max_model_len - 1: room for one), found without encoding all of it
    (Tokenizer.exceeds): refusing an 8 MiB prompt costs what max_model_len tokens do."""
    if state.tokenizer.exceeds(text, state.max_model_len - 1 if limit is None else limit):
        raise bad_request(f"This model's maximum context length is {state.max_model_len} "
                          f"tokens. However, your prompt has more ({len(text)} characters).",
                          param)


def _check_fan_out(state: ServerState, prompts: int, choices: int, param: str) -> None:
    """A 400 naming `param` (n or best_of) for a body that would start more engine
    requests than --max-sequences-per-request."""
    if prompts * choices > state.max_sequences:
        raise bad_request(f"{param}: {prompts} prompt(s) x {choices} choices = "
                          f"{prompts * choices} sequences; a request may start at most "
                          f"{state.max_sequences}", param)


def _max_tokens(state: ServerState, requested: int | None, prompt_len: int, param: str) -> int:
    room = state.max_model_len - prompt_len
    if room <= 0:
        raise bad_request(f"This model's maximum context length is {state.max_model_len} "
                          f"tokens. However, your prompt has {prompt_len} tokens.", "prompt")
    if requested is None:
        return room
    if requested < 1:
        raise bad_request(f"{param} must be at least 1, got {requested}", param)
    if requested > room:
        raise bad_request(f"This model's maximum context length is {state.max_model_len} "
                          f"tokens. However, you requested {prompt_len + requested} tokens "
                          f"({prompt_len} in the prompt, {requested} for the completion).",
                          param)
    return requested


async def _check_structured(state: ServerState, params: SamplingParams,
                            field: str | None) -> None:
    """A 400 naming `field` if the request's output constraint does not compile (in a
    thread: building the vocabulary the first time, or a large grammar, takes a while
    that the other streams must not wait)."""
    if params.structured is None:
        return
    try:
        await state.offload(lambda: state.vocabulary().check(params.structured))
    except GrammarError as exc:
        raise bad_request(f"{field}: {exc}", field) from None


def _validate(state: ServerState, req, prompts: list[list[int]],
              params: SamplingParams) -> None:
    """The engine's checks of each prompt's ids with these params (a pass over every id:
    call it on the preparation threads); a 400 under the endpoint's field names."""
    try:
        for ids in prompts:
            state.engine.admission.validate(ids, params)
    except InvalidParam as exc:
        raise req.invalid(exc) from None


# -- generation ------------------------------------------------------------------------


async def _run(state: ServerState,
               body: Add) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Outputs of every choice of the body (by its index) as they come: the body goes to
    the engine as one (its prompts and params once; its requests one group, which
    admission takes turns with), and comes back as one bounded stream (a request's news
    merged while it is not read: this generator not pulled is a paused client).
    Stopping early aborts what is unfinished."""
    index = {choice.request_id: i for i, choice in enumerate(body.choices)}
    start = time.perf_counter()
    last: dict[int, float] = {}
    metrics = state.metrics
    async with aclosing(state.engine.stream(body)) as batches:
        async for batch in batches:
            now = time.perf_counter()
            for out in batch:
                i = index[out.request_id]
                if out.new_ids:
                    if i in last:
                        metrics.observe_gap((now - last[i]) / len(out.new_ids))
                    else:
                        metrics.observe_first(now - start)
                    last[i] = now
                if out.finished:
                    metrics.observe_end(now - start)
                yield i, out


def _fan_out(base: str, prompts: list[list[int]], params: SamplingParams, n: int) -> Add:
    """The body's engine requests: n choices per prompt, choice i (prompt i // n) the
    request f"{base}-{i}"; with a seed, choice j of a prompt samples with seed + j."""
    seeds = [None] * n if params.seed is None else \
        [_wrap_seed(params.seed + j) for j in range(n)]
    return Add(prompts, params, [Choice(f"{base}-{p * n + j}", p, seeds[j])
                                 for p in range(len(prompts)) for j in range(n)], base)


def _wrap_seed(seed: int) -> int:
    """seed + j stays a signed 64-bit seed (it wraps, as 64-bit arithmetic would)."""
    return (seed - SEED_MIN) % 2**64 + SEED_MIN


def _include_usage(req) -> bool:
    return bool(req.stream_options and req.stream_options.include_usage)


def _sse(payload: dict | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload)
    return f"data: {data}\n\n".encode()


# -- endpoints -------------------------------------------------------------------------


async def completions(state: ServerState, request: Request) -> Response:
    req = await _body(state, request, CompletionRequest)
    req.cache_salt = state.cache_salts.of(req.cache_salt, request.headers.get("authorization"))
    req.check_common(state.choice_limit)
    candidates = req.check_best_of(state.choice_limit)
    _check_model(state, req.model)
    if req.echo and req.logprobs is not None:
        raise bad_request("echo with logprobs needs prompt log-probs, which this server "
                          "does not compute", "echo")
    given = req.prompts()
    if len(given) > state.max_prompts:
        raise bad_request(f"a request may carry at most {state.max_prompts} prompts, got "
                          f"{len(given)}", "prompt")
    _check_fan_out(state, len(given), candidates, "n" if req.best_of is None else "best_of")
    batched = isinstance(req.prompt, list) and not isinstance(req.prompt[0], int)
    prompts = await state.offload(lambda: [
        _prompt_ids(state, p, f"prompt[{i}]" if batched else "prompt")
        for i, p in enumerate(given)])
    longest = max(len(p) for p in prompts)
    max_tokens = _max_tokens(state, req.max_tokens, longest, "max_tokens")
    # best_of ranks candidates by the log-probs of their tokens, so it always computes them
    ranked = candidates > req.n
    params = req.sampling(max_tokens, 0 if ranked and req.logprobs is None else req.logprobs,
                          req.structured())
    await _check_structured(state, params, req.structured_source())
    await state.offload(_validate, state, req, prompts, params)
    base = f"cmpl-{next(state.ids)}-{int(time.time() * 1000)}"
    body = _fan_out(base, prompts, params, candidates)
    echo = [""] * len(prompts)
    if req.echo and state.tokenizer:
        echo = await state.offload(lambda: [state.tokenizer.decode(p) for p in prompts])
    meta = {"id": base, "created": int(time.time()), "model": state.model_name}
    if req.stream:
        n, text = req.n, state.token_text
        opening = [completion_chunk(meta, i, echo[i // n], None, None, None)
                   for i in range(len(body.choices)) if echo[i // n]]

        def chunk(index, out, choice):
            return completion_chunk(meta, index, out.new_text, choice.logprobs_delta(out, text),
                                    out.finish_reason, out.stop_reason)

        return StreamingResponse(_stream(state, body, meta, n, _include_usage(req),
                                         "text_completion", opening, chunk),
                                 media_type="text/event-stream")
    shown = None if req.logprobs is None else CompletionLogprobs
    states = await _finished(state, request, body, logprobs=shown)
    if ranked:
        states = _best(states, req.n, candidates)
    return await _json(state, completion_response, meta, states, echo, req.n)


async def _json(state: ServerState, write: Callable, *args) -> Response:
    """A JSON response whose body write(*args) makes on a preparation thread (a large
    one is megabytes: the event loop only sends it)."""
    return Response(await state.offload(write, *args), media_type="application/json")


def _best(states: list[ChoiceState], n: int, candidates: int) -> list[ChoiceState]:
    """Per prompt, the n candidates with the highest total log-prob (earlier first on a
    tie), renumbered as that prompt's choices 0..n-1 (their log-probs shown if asked)."""
    best = []
    for first in range(0, len(states), candidates):
        group = states[first:first + candidates]
        group = sorted(group, key=lambda st: -st.cumulative_logprob)[:n]
        for rank, st in enumerate(group):
            best.append(replace(st, index=first // candidates * n + rank))
    return best


async def _stream(state: ServerState, body: Add, meta: dict, n: int, include_usage: bool,
                  kind: str, opening: list[dict], chunk, reader=None):
    """SSE for every choice: the opening chunks, one chunk(index, output, choice) per
    output that carries news, the usage chunk when asked, then [DONE]. `reader`: makes
    each chat choice's ChatOutput. A client that does not read parks this generator at
    a write; its outputs wait merged (runtime/engine/output_stream.py)."""
    states = _choices(body, reader)
    try:
        for payload in opening:
            yield _sse(payload)
        async with aclosing(_run(state, body)) as outs:   # a raise aborts the rest
            async for index, out in outs:
                states[index].add(out)
                if out.new_text or out.finished or out.new_ids:
                    yield _sse(chunk(index, out, states[index]))
        if include_usage:
            yield _sse({**meta, "object": kind, "choices": [], "usage": usage(states, n)})
    except EngineDeadError as exc:
        yield _sse(APIError(503, str(exc), "ServiceUnavailableError").body())
    except RequestFailedError as exc:
        yield _sse(_failed(exc).body())
    except Exception as exc:  # noqa: BLE001 - end this stream in shape, serve the rest
        log.exception("stream %s failed", body.group)
        yield _sse(APIError(500, f"internal error: {type(exc).__name__}",
                            "InternalServerError").body())
    yield _sse("[DONE]")


def _choices(body: Add, reader=None, logprobs: Callable | None = None,
             text: TokenText | None = None) -> list[ChoiceState]:
    """A ChoiceState per choice of the body, in index order. `reader` makes a chat
    choice's ChatOutput; `logprobs` its log-prob accumulator (over `text`)."""
    return [ChoiceState(i, len(body.prompts[choice.prompt]),
                        reader=reader() if reader else None,
                        logprobs=logprobs(text) if logprobs else None)
            for i, choice in enumerate(body.choices)]


async def _finished(state: ServerState, request: Request, body: Add, reader=None,
                    logprobs: Callable | None = None) -> list[ChoiceState]:
    """Every choice run to the end, each output added as it comes (O(its news), its
    log-probs encoded then: `logprobs` makes a choice's accumulator); everything is
    aborted if the client goes away first."""
    states = _choices(body, reader, logprobs, state.token_text)

    async def consume() -> None:
        async with aclosing(_run(state, body)) as outs:
            async for index, out in outs:
                states[index].add(out)

    task = asyncio.create_task(consume())
    while not task.done():
        done, _ = await asyncio.wait({task}, timeout=0.2)
        if not done and await request.is_disconnected():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise APIError(499, "the client disconnected", "ClientClosedRequest")
    task.result()
    return states


async def chat_completions(state: ServerState, request: Request) -> Response:
    req = await _body(state, request, ChatCompletionRequest)
    req.cache_salt = state.cache_salts.of(req.cache_salt, request.headers.get("authorization"))
    req.check()
    req.check_common(state.choice_limit)
    _check_fan_out(state, 1, req.n, "n")
    _check_model(state, req.model)
    if state.tokenizer is None:
        raise bad_request("this checkpoint has no tokenizer, so chat is unavailable")
    plan = await state.offload(chat.plan, state.tokenizer, req, state.chat_options,
                               state.max_model_len - 1)
    ids = plan.prompt_ids
    requested = req.max_completion_tokens if req.max_completion_tokens is not None \
        else req.max_tokens
    param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    max_tokens = _max_tokens(state, requested, len(ids), param)
    top = (req.top_logprobs or 0) if req.logprobs else None
    params = req.sampling(max_tokens, top, plan.structured)
    try:
        await _check_structured(state, params, _constraint_field(req, plan))
    except APIError:
        if plan.fallback is None:
            raise
        params = req.sampling(max_tokens, top, plan.fallback)   # tool names only
        await _check_structured(state, params, "tools")
    await state.offload(_validate, state, req, [ids], params)

    def reader() -> ChatOutput:
        return ChatOutput(plan, state.chat_options)

    base = f"chatcmpl-{next(state.ids)}-{int(time.time() * 1000)}"
    body = _fan_out(base, [ids], params, req.n)
    meta = {"id": base, "created": int(time.time()), "model": state.model_name}
    if req.stream:
        text = state.token_text
        opening = [chat_chunk(meta, i, {"role": "assistant", "content": ""}, None, None, None)
                   for i in range(req.n)]

        def chunk(index, out, choice):
            finish = choice.reader.finish_reason(out.finish_reason)
            return chat_chunk(meta, index, choice.delta, choice.chat_logprobs_delta(out, text),
                              finish, out.stop_reason)

        return StreamingResponse(_stream(state, body, meta, req.n, _include_usage(req),
                                         "chat.completion.chunk", opening, chunk, reader),
                                 media_type="text/event-stream")
    states = await _finished(state, request, body, reader,
                             ChatLogprobs if req.logprobs else None)
    return await _json(state, chat_response, meta, states, req.n)


def _constraint_field(req: ChatCompletionRequest, plan: chat.ChatPlan) -> str:
    """The field a chat request's output constraint comes from, for its 400s."""
    if plan.tool_mode in ("named", "required"):
        return "tool_choice"
    if (asked := req.structured_source()) is not None:
        return asked
    return "tools" if plan.tool_mode == "auto" else "thinking_token_budget"


async def models(state: ServerState, request: Request) -> Response:
    return JSONResponse({"object": "list", "data": [{
        "id": state.model_name, "object": "model", "created": 0, "owned_by": "v4serve",
        "root": state.model_name, "parent": None, "max_model_len": state.max_model_len}]})


async def tokenize(state: ServerState, request: Request) -> Response:
    req = await _body(state, request, TokenizeRequest)
    _check_model(state, req.model)
    if state.tokenizer is None:
        raise bad_request("this checkpoint has no tokenizer")
    return await _json(state, _tokenized, state, req)


def _tokenized(state: ServerState, req: TokenizeRequest) -> bytes:
    """/tokenize's body: the ids of the prompt, or of the chat prompt of the messages
    (and tools). A prompt of more than max_model_len tokens is a 400 found without
    encoding it whole, as on the completions routes."""
    limit = state.max_model_len
    if req.messages is not None:
        ids = chat.render_request(state.tokenizer, req, state.chat_options, limit)
    elif req.prompt is not None:
        _check_text_size(state, req.prompt, "prompt", limit)
        ids = state.tokenizer.encode(req.prompt)
    else:
        raise bad_request("give prompt or messages", "prompt")
    if len(ids) > limit:          # past what Tokenizer.exceeds could tell without encoding
        raise bad_request(f"This model's maximum context length is {limit} tokens. "
                          f"However, the prompt has {len(ids)} tokens.",
                          "prompt" if req.messages is None else "messages")
    return (f'{{"tokens":{_ids_json(ids)},"count":{len(ids)},'
            f'"max_model_len":{state.max_model_len}}}').encode()


def _ids_json(ids: list[int], piece: int = 8192) -> str:
    """A JSON array of token ids, encoded a piece at a time (a preparation thread lets
    the event loop run between two pieces)."""
    return "[" + ",".join(dumps(ids[at:at + piece])[1:-1]
                          for at in range(0, len(ids), piece)) + "]"


async def detokenize(state: ServerState, request: Request) -> Response:
    req = await _body(state, request, DetokenizeRequest)
    _check_model(state, req.model)
    if state.tokenizer is None:
        raise bad_request("this checkpoint has no tokenizer")
    return await _json(state, lambda: dumps({"prompt": state.tokenizer.decode(
        _prompt_ids(state, req.tokens, "tokens"))}).encode())


def _metrics(state: ServerState, request: Request) -> Response:
    """/metrics: public, as in vLLM, unless --metrics-require-api-key."""
    if state.metrics_require_api_key and state.api_key \
            and not _authorized(request, state.api_key):
        return _error(APIError(401, "missing or wrong API key", "AuthenticationError"))
    return Response(state.metrics.render(), media_type="text/plain; version=0.0.4")


def health(state: ServerState) -> Response:
    if state.ready and state.engine.healthy and not state.draining:
        return Response(status_code=200)
    return Response(status_code=503)


def _info(state: ServerState, request: Request) -> Response:
    """/server_info names paths, hosts and pids: behind the API key when there is one."""
    if state.api_key and not _authorized(request, state.api_key):
        return _error(APIError(401, "missing or wrong API key", "AuthenticationError"))
    if not state.engine.ready:
        return _error(APIError(503, "the engine is still loading", "ServiceUnavailableError"))
    return JSONResponse(server_info(state))


def server_info(state: ServerState) -> dict:
    engine, c = state.engine, state.spec.contract
    admission, summary, snapshot = engine.admission, engine.summary(), engine.snapshot()
    cap, limits = admission.capacity, admission.limits
    return {
        "spec": state.spec.SPEC_NAME, "spec_path": state.spec.SPEC_PATH,
        "model": state.model_name, "checkpoint": summary["checkpoint"],
        "param_bytes_per_rank": summary["param_bytes_per_rank"],
        "backend": summary["backend"], "device": summary["device"],
        # uni: every rank in the engine's process; mp: a process per rank (pid, host,
        # device, param and pool bytes of each)
        "executor": summary.get("executor", "uni"), "processes": summary.get("processes"),
        "engine": engine.kind, "engine_pid": engine.pid,
        "topology": {"ranks": c.RANKS, "dp": c.DP, "ep": c.EP, "tp": c.TP, "device": c.DEVICE,
                     "dtype": c.DTYPE, "backend": c.BACKEND},
        "contract": {"tile": c.TILE, "max_extent": c.MAX_EXTENT,
                     "slots_per_rank": c.SLOTS_PER_RANK, "mtp_window": c.MTP_WINDOW,
                     "block_size": c.BLOCK_SIZE, "effective_extent": limits.effective_extent},
        "decode_layouts": {str(k): {"batch": lay.batch, "seq": lay.seq, "kernel": lay.kernel}
                           for k, lay in c.DECODE_LAYOUTS.items()},
        "pool_capacity": {"tokens_per_rank": cap.tokens, "bytes_per_rank": cap.bytes,
                          "blocks_per_rank": cap.blocks,
                          "max_concurrency": summary["max_concurrency"]},
        # `v4serve plan`'s figures for this configuration: weights by kind, memory, pools
        "memory_plan": summary["plan"],
        "limits": {"max_num_batched_tokens": limits.max_num_batched_tokens,
                   "max_model_len": limits.max_model_len,
                   "max_num_seqs": limits.max_num_seqs,
                   "chunked_prefill": limits.chunked_prefill},
        "mtp": {"enabled": admission.k > 0, "num_speculative_tokens": admission.k},
        "graphs": snapshot["graphs"],
        # prompt tokens looked up and found; per rank: hit rate and cached blocks
        "prefix_cache": snapshot["prefix_cache"],
    }
