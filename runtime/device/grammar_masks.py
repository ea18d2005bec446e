"""Structured outputs on the device side: each constrained request's grammar matcher
(compiled off the step, on a thread of its own), and the token masks a launch's rows
take from them: packed [n, ceil(V / 32)] int32 words for the MTP draft, unpacked
[n, V] bool for the sampler."""
from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from runtime.core.request import Request
from runtime.sampling import batch_sampler
from runtime.text.grammar import GrammarError, StructuredOutputs, TokenMasks, Vocabulary
from runtime.text.tokenizer import Tokenizer


class GrammarMasks:
    """The requests' matchers and masks. Built lazily: the grammar vocabulary comes from
    the checkpoint's tokenizer at the first constrained request."""

    def __init__(self, checkpoint: Path | None, config: dict, device: torch.device):
        self.checkpoint, self.config, self.device = checkpoint, config, device
        self.vocab_size = config["vocab_size"]
        self._masks: TokenMasks | None = None
        self._lock = threading.Lock()
        self._compiler: ThreadPoolExecutor | None = None
        # the unconstrained draft mask of each launch shape, and its device copy
        self._all_allowed: dict[tuple[int, int], tuple[np.ndarray, torch.Tensor]] = {}

    # -- matchers --------------------------------------------------------------------

    def token_masks(self) -> TokenMasks:
        with self._lock:                   # prepare() may build them on its thread
            if self._masks is None:
                self._masks = TokenMasks(self._vocabulary())
        return self._masks

    def prepare(self, constraint: StructuredOutputs) -> Future:
        """Compile a request's grammar (the first time, the grammar vocabulary too) on a
        thread of its own. The future's result is the request's matcher: the engine
        hands it back with `adopt` and schedules the request, so no step compiles."""
        if self._compiler is None:
            self._compiler = ThreadPoolExecutor(1, thread_name_prefix="v4serve-grammar")
        return self._compiler.submit(lambda: self.token_masks().vocabulary.matcher(constraint))

    def adopt(self, request: Request, prepared) -> None:
        """The matcher `prepare` compiled becomes the request's."""
        self.token_masks().adopt(request.request_id, prepared)

    def forget(self, request_id: str) -> None:
        if self._masks is not None:
            self._masks.forget(request_id)

    def close(self) -> None:
        """Stop the grammar thread (compiles not started are dropped)."""
        if self._compiler is not None:
            self._compiler.shutdown(wait=False, cancel_futures=True)

    def _vocabulary(self) -> Vocabulary:
        path = self.checkpoint / "tokenizer.json" if self.checkpoint else None
        if path is None or not path.exists():
            raise GrammarError("structured outputs need the checkpoint's tokenizer.json")
        return Vocabulary.of(Tokenizer(self.checkpoint), self.config)

    # -- masks -----------------------------------------------------------------------

    def check(self, request: Request) -> None:
        """Build a constrained request's mask now: a grammar that fails, fails here."""
        if request.params.structured is not None:
            self.token_masks().mask(request)

    def masks(self, requests: list[Request]) -> np.ndarray | None:
        """[n, ceil(V / 32)] int32: each row's grammar mask for its next token (None: no
        row is constrained)."""
        if all(r.params.structured is None for r in requests):
            return None
        return self.token_masks().masks(requests)

    def draft_mask(self, shape: tuple[int, int], rows: list[tuple[Request, int]] = (),
                   tail_masks: np.ndarray | None = None) -> np.ndarray | torch.Tensor:
        """[ranks, batch, ceil(V / 32)] int32: the fused MTP decode's draft mask, every
        token allowed but to the (request, row)s of `rows`, which take `tail_masks`.
        Without constrained rows it is a device tensor made once (nothing crosses from
        the host), shared: no caller writes to it."""
        if shape not in self._all_allowed:
            words = np.full((*shape, (self.vocab_size + 31) // 32), -1, np.int32)
            self._all_allowed[shape] = words, torch.from_numpy(words).to(self.device)
        host, here = self._all_allowed[shape]
        if tail_masks is None:
            return here
        mask = host.copy()
        for (request, row), words in zip(rows, tail_masks):
            mask[request.rank, row] = words
        return mask

    def allowed(self, requests: list[Request]) -> torch.Tensor | None:
        """[n, V] bool: the tokens each row may take next (None: no row is constrained)."""
        masks = self.masks(requests)
        return None if masks is None else self._unpack(masks)

    def allowed_after_draft(self, requests: list[Request], tail_masks: np.ndarray | None,
                            draft: torch.Tensor) -> torch.Tensor | None:
        """[n, K+1, V] bool for fused MTP rows with drafts [n, K]: the mask at the tail
        (the launch drafted under it too), then the mask after each draft. The drafts of
        constrained rows come to the host for it (one small copy, only in a step that has
        such a row)."""
        if tail_masks is None:
            return None
        later = self.token_masks().draft_masks(requests, draft.tolist(), tail_masks)
        return self._unpack(np.concatenate((tail_masks[:, None], later), axis=1))

    def _unpack(self, masks: np.ndarray) -> torch.Tensor:
        words = torch.from_numpy(masks).to(self.device)
        return batch_sampler.unpack_mask(words, self.vocab_size)
