"""The logits as one request: batch × seq × vocab, in the compute dtype and upcast to fp32.

transformers' causal-LM heads compute ``logits = self.lm_head(hidden_states)`` (half under mixed precision), and the
loss upcasts them (``logits = logits.float()``, ``transformers/loss/loss_utils.py`` ``ForCausalLMLoss``) before
``cross_entropy``, whose log-softmax is another fp32 tensor of the same size; backward makes their gradients, again
of that size.  Releases before the label-padding loss (and many hand-written loops) also copy the shifted logits
(``logits[..., :-1, :].contiguous()``): batch × (seq − 1) × vocab.

With the batch and the sequence length given the size is one product.  Without them, the request says how many tokens
(b × s) it would take; a token count is kept only when it factors as a plausible batch × sequence length (the
one given, or a power-of-two length from 128 to 128 Ki with a batch up to 1,024) -- any count matches some shape,
so the factorisation is what makes it a candidate, and it is named as an assumption.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from oomlab.core.models import ModelSpec
from oomlab.core.units import format_size
from oomlab.explanation.aggregate import Aggregate, AggregateKind
from oomlab.explanation.context import RunContext
from oomlab.explanation.phase import PhaseCode

ROUND_SEQS = tuple(2**k for k in range(7, 18))  # 128 … 131072 tokens
MAX_BATCH = 1024
COMMON_SEQ = 8192  # NB: shapes named first up to this length (fine-tuning runs 512 to 8192 tokens), then longer
MAX_SOLVED = 3  # token counts kept per dtype when solving (the request's window holds a few dozen at most)
MAX_TOKENS = MAX_BATCH * ROUND_SEQS[-1]
MAX_WINDOW = 10_000  # token counts scanned in one request range: wider only for an edited, imprecise figure
_SHAPES = (
    (2, AggregateKind.LOGITS, "bf16/fp16",
     "the LM head's output in forward (lm_head(hidden_states)), or its gradient in backward"),
    (4, AggregateKind.LOGITS_FP32, "fp32",
     "the loss's upcast (logits.float(): transformers/loss/loss_utils.py ForCausalLMLoss), cross_entropy's "
     "log_softmax of it, or their gradients in backward"),
)
_PHASES = frozenset({PhaseCode.FORWARD, PhaseCode.BACKWARD})


def _factorisations(tokens: int, ctx: RunContext) -> list[tuple[int, int]]:
    """``(batch, seq)`` pairs that make ``tokens``: with the batch or seq given, its partner; else round lengths."""
    if ctx.batch is not None:
        return [(ctx.batch, tokens // ctx.batch)] if tokens % ctx.batch == 0 else []
    if ctx.seq is not None:
        return [(tokens // s, s) for s in (ctx.seq, ctx.seq - 1) if s > 0 and tokens % s == 0][:1]
    pairs = [(tokens // s, s) for s in ROUND_SEQS if tokens % s == 0 and tokens // s <= MAX_BATCH]
    return sorted(pairs, key=lambda p: (p[1] > COMMON_SEQ, -p[1]))[:3]


def _roundness(seq: int) -> int:
    """How round a sequence length is: its factors of two (4096 → 12, 2047 → 0)."""
    return (seq & -seq).bit_length() - 1


def _aggregate(kind: AggregateKind, dtype: str, where: str, itemsize: int, vocab: int, tokens: int,
               arithmetic: str, solved: str | None, shifted: bool) -> Aggregate:
    nbytes = tokens * vocab * itemsize
    what = f"the {'shifted ' if shifted else ''}logits in {dtype}"
    if shifted:
        where = "the shifted copy logits[..., :-1, :].contiguous() (older transformers, hand-written loops); " + where
    return Aggregate(kind=kind, what=what, arithmetic=f"{arithmetic} × {vocab:,} vocab × {itemsize} bytes = "
                     f"{format_size(nbytes)}", nbytes=nbytes, span=(nbytes, nbytes), where=where, phases=_PHASES,
                     solved=solved)


def logits(spec: ModelSpec, ctx: RunContext, request: tuple[tuple[int, int], ...]) -> Iterator[Aggregate]:
    """The logits (and their shifted copy) for the batch and seq given, or for each plausible b × s the request
    allows."""
    vocab = spec.vocab_size
    for itemsize, kind, dtype, where in _SHAPES:
        if ctx.batch is not None and ctx.seq is not None:
            for seq in (ctx.seq, ctx.seq - 1):
                if seq > 0:
                    yield _aggregate(kind, dtype, where, itemsize, vocab, ctx.batch * seq,
                                     f"{ctx.batch} × {seq} tokens", None, seq != ctx.seq)
            continue
        found = []
        for lo, hi in request:
            per_token = vocab * itemsize
            first, last = max(1, math.ceil(lo / per_token)), min(hi // per_token, MAX_TOKENS)
            if last - first <= MAX_WINDOW:
                found += [(tokens, pairs) for tokens in range(first, last + 1)
                          if (pairs := _factorisations(tokens, ctx))]
        found.sort(key=lambda f: -_roundness(f[1][0][1]))  # a batch given: 16 × 2048 before 16 × 2047
        for tokens, pairs in found[:MAX_SOLVED]:
            named = [f"{b} × {s}" for b, s in pairs]
            shapes = named[0] if len(named) == 1 else ", ".join(named[:-1]) + " or " + named[-1]
            shifted = ctx.seq is not None and pairs[0][1] == ctx.seq - 1
            yield _aggregate(kind, dtype, where, itemsize, vocab, tokens, f"{tokens:,} tokens",
                             f"b × s = {tokens:,} tokens ({shapes})", shifted)
