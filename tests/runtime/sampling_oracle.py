"""The sampling oracle: what one row of runtime/sampling/batch_sampler.py must sample from, written
from vLLM's semantics alone.

It is independent of the sampler by construction: numpy float64, one row at a time,
plain sorts and comparisons, and nothing taken from runtime/ (not even its constants):
a shared mistake would have to be made twice, in two styles. The order is vLLM's:

    logit bias (a token given twice: the sum), repetition penalty (tokens of prompt or
    output: positive logits divided, negative ones multiplied), frequency and presence
    penalties (output counts), then the logits saturate at float32's largest finite value
    (the model's logits are float32; v4serve clamps where vLLM would overflow to inf),
    then the grammar mask (-inf where not allowed); then greedy (temperature < 1e-5:
    the argmax, lowest id first) or temperature, top-k (ties at the k-th value kept),
    softmax, top-p (a token goes when the mass of the tokens strictly more likely than
    it reaches p), min-p (a token goes when p < min_p * max p), renormalized.

The production path is float32, so compare probabilities with a tolerance (atol 1e-5 is
ample for well-conditioned rows), and where float32 rounding may decide a cut, ask
`support` with a tolerance rather than `distribution`.
"""
from __future__ import annotations

import numpy as np

GREEDY_BELOW = 1e-5                                 # a temperature below this is greedy
F32_MAX = float(np.finfo(np.float32).max)


def dense_bias(logit_bias, vocab: int) -> np.ndarray:
    """The logit bias pairs as a dense row [V] (a token given twice: the sum)."""
    bias = np.zeros(vocab)
    for token, value in logit_bias:
        bias[token] += value
    return bias


def adjusted_logits(logits, params, prompt, output, allowed=None) -> np.ndarray:
    """Logits [V] with the request's bias and penalties (prompt and output: token lists),
    saturated at float32's range, and -inf where `allowed` [V] bool is False."""
    a = np.array(logits, dtype=np.float64)
    vocab = a.shape[0]
    a = a + dense_bias(params.logit_bias, vocab)
    counts = np.zeros(vocab)
    for token in output:
        counts[token] += 1
    seen = counts > 0
    for token in prompt:
        seen[token] = True
    rep = params.repetition_penalty
    with np.errstate(over="ignore", under="ignore"):
        for t in range(vocab):
            if seen[t]:
                a[t] = a[t] / rep if a[t] > 0 else a[t] * rep
        a = a - params.frequency_penalty * counts - params.presence_penalty * (counts > 0)
    a = np.clip(a, -F32_MAX, F32_MAX)
    if allowed is not None:
        a[~np.asarray(allowed, dtype=bool)] = -np.inf
    return a


def is_greedy(params) -> bool:
    return params.temperature < GREEDY_BELOW


def greedy_token(adjusted) -> int:
    """The argmax of adjusted logits [V], the lowest id among equal maxima."""
    return int(np.argmax(np.asarray(adjusted, dtype=np.float64)))


def distribution(adjusted, params, slack: float = 0.0) -> np.ndarray:
    """The probabilities [V] a row with these adjusted logits samples from (greedy: all
    mass on greedy_token). `slack` > 0 loosens the top-p and min-p cuts by that much
    (absolute for top-p's mass, relative for the probabilities compared), < 0 tightens
    them: a row whose distribution hardly changes with slack = +-1e-5 is
    well-conditioned for float32."""
    a = np.asarray(adjusted, dtype=np.float64)
    vocab = a.shape[0]
    if is_greedy(params):
        p = np.zeros(vocab)
        p[greedy_token(a)] = 1.0
        return p
    keep = np.isfinite(a)
    if 0 < params.top_k < vocab:
        kth = np.sort(a)[::-1][params.top_k - 1]
        keep &= a >= kth
    with np.errstate(over="ignore", under="ignore"):
        scaled = (a - a[keep].max()) / params.temperature
        p = np.where(keep, np.exp(np.where(keep, scaled, 0.0)), 0.0)
    p = p / p.sum()
    likelier = p[None, :] > p[:, None] * (1 + slack)     # [t, u]: u is likelier than t
    np.fill_diagonal(likelier, False)
    above = np.where(likelier, p[None, :], 0.0).sum(1)
    top = p.max()
    p = np.where((above >= params.top_p + slack) & (p < top), 0.0, p)      # the top stays
    p = np.where((p * (1 + slack) < params.min_p * top) & (p < top), 0.0, p)
    return p / p.sum()


def possible(adjusted, params, tol, token: int, slack: float = 1e-4) -> bool:
    """Whether a row may draw (greedy: take) `token` when its adjusted logits [V] are
    known only to within `tol` [V] (float32 rounding): whether the token has positive
    probability (is the argmax) with its logit raised by its tolerance and every other
    lowered by theirs, the most favourable case for it under every cut."""
    a = np.asarray(adjusted, dtype=np.float64)
    tol = np.minimum(np.broadcast_to(np.asarray(tol, dtype=np.float64), a.shape), 1e300)
    if not np.isfinite(a[token]):
        return False
    finite = np.isfinite(a)
    b = np.where(finite, np.clip(a - tol, -1e300, 1e300), -np.inf)
    b[token] = min(a[token] + tol[token], 1e300)
    if is_greedy(params):
        return bool(b[token] >= b.max())
    return bool(distribution(b, params, slack)[token] > 0)


def support(adjusted, params, tol, slack: float = 1e-4) -> np.ndarray:
    """[V] bool: the tokens `possible` for this row."""
    return np.array([possible(adjusted, params, tol, t, slack)
                     for t in range(len(adjusted))], dtype=bool)


def verify_distributions(logits, params, prompt, output, drafts: list[int], allowed=None
                         ) -> tuple[list[np.ndarray], list[float]]:
    """K MTP drafts: logits [K+1, V] (tail, then after each draft), the drafts [K], masks
    [K+1, V] -> (dists: K+1 of [V], accepts: K). Position j is reached when drafts
    0..j-1 were kept; there its committed token is distributed as dists[j] (drafts 0..j-1
    counted as output; lossless, whatever draft j is), and draft j is kept with
    probability accepts[j] = dists[j][draft j] (greedy: 1 when it is the argmax, else 0).
    Position K's token is the bonus."""
    rows = np.asarray(logits, dtype=np.float64)
    dists = [distribution(adjusted_logits(rows[j], params, prompt, [*output, *drafts[:j]],
                                          None if allowed is None else allowed[j]), params)
             for j in range(len(drafts) + 1)]
    return dists, [float(dists[j][d]) for j, d in enumerate(drafts)]


def verify_distribution(logits, params, prompt, output, draft: int, allowed=None
                        ) -> tuple[np.ndarray, float, np.ndarray]:
    """One MTP draft (verify_distributions with K = 1): logits [2, V] (tail, draft), the
    draft token, masks [2, V] -> (first [V], accept, bonus [V]). The first committed
    token is distributed as `first` whatever the draft (lossless); the draft is kept with
    probability `accept` (greedy: 1 when it is the argmax, else 0), and then the bonus
    token is distributed as `bonus` (the draft counted as output)."""
    (first, bonus), (accept,) = verify_distributions(logits, params, prompt, output, [draft],
                                                     allowed)
    return first, accept, bonus
