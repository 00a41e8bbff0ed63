"""Batched greedy decoding for WhisperTorch with a dense KV cache, step for step what CTranslate2's Whisper
``generate`` does with beam_size=1 (models/whisper.cc, decoding.cc, decoding_utils.cc, CTranslate2 4.x):

- the prompt ``[<|startofprev|> text..., <|startoftranscript|>, lang, task, (<|notimestamps|>)]`` is split after
  its special run: everything but the run's last token is forwarded at once, the last token starts the loop;
- at most ``min(max_length // 2, max_length - forwarded)`` steps; EOT ends a row and is not part of its tokens, but
  its log-probability counts in the score; the returned score is the summed log-probability / number of tokens;
- logits processors in CTranslate2's order: no-repeat n-gram (over the generated tokens), suppress_tokens,
  suppress_blank (first step), then the timestamp rules when the prompt does not end with <|notimestamps|>;
  suppressed logits are -inf before the log-softmax that gives the scores;
- the no-speech probability is the softmax of the full logits at the <|startoftranscript|> position.

Rows join with prompts of different lengths (left padding, masked) and leave the batch when they finish; each row's
result equals its decode alone. The cross-attention K/V are computed once per clip (``TextDecoder.start``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from .whisper_torch import WhisperTorch


@dataclass(frozen=True)
class SpecialTokens:
    sot: int
    eot: int
    no_timestamps: int
    no_speech: int
    n_vocab: int

    @property
    def timestamp_begin(self) -> int:
        return self.no_timestamps + 1


@dataclass(frozen=True)
class DecodeOptions:
    suppress: tuple[int, ...] = ()  # always -inf
    suppress_begin: tuple[int, ...] = ()  # -inf at the first step (suppress_blank)
    no_repeat_ngram: int = 0
    max_initial_timestamp_index: int = 50  # timestamp rules: the first timestamp is at most 1.0 s


@dataclass
class Decoded:
    tokens: list[int] = field(default_factory=list)  # generated, without EOT
    logprob_sum: float = 0.0  # including EOT's when the row ended on it
    no_speech_prob: float = 0.0

    @property
    def score(self) -> float:
        """CTranslate2's returned score: summed log-probability / token count (-inf for an empty result)."""
        if not self.tokens:
            return float("-inf") if self.logprob_sum < 0 else 0.0
        return self.logprob_sum / len(self.tokens)


def split_prompt(prompt: list[int], sp: SpecialTokens) -> tuple[list[int], int, int]:
    """(tokens forwarded before the loop, the start token, index of <|startoftranscript|>), as whisper.cc."""
    sot_index = prompt.index(sp.sot)
    end = sot_index
    while end < len(prompt) and sp.sot <= prompt[end] <= sp.no_timestamps:
        end += 1
    if end != len(prompt):
        raise ValueError("a decoding prefix after the task tokens is not supported")
    return prompt[: end - 1], prompt[end - 1], sot_index


def _ngram_bans(seq: list[int], n: int) -> set[int]:
    """Tokens that would repeat an n-gram of ``seq`` (CTranslate2 NoRepeatNgram)."""
    if n <= 0 or len(seq) < n:
        return set()
    tail = seq[len(seq) - n + 1:]
    return {seq[i + n - 1] for i in range(len(seq) - n + 1) if seq[i:i + n - 1] == tail}


class _TimestampRules:
    """CTranslate2's ApplyTimestampRules for one batch step (sample_begin = 0: no decoding prefix)."""

    def __init__(self, sp: SpecialTokens, max_initial_index: int) -> None:
        self.sp = sp
        self.begin = sp.timestamp_begin
        self.end = sp.n_vocab - 1
        self.max_initial = self.begin + max_initial_index

    def apply(self, step: int, seqs: list[list[int]], logits: Tensor, ban: Tensor) -> None:
        b, e = self.begin, self.end
        check = []
        for r, seq in enumerate(seqs):
            ban[r, self.sp.no_timestamps] = True
            if step == 0:
                ban[r, :b] = True
                ban[r, self.max_initial + 1: e + 1] = True
                continue
            last = seq[step - 1]
            if last >= b:
                penultimate = seq[step - 2] if step - 1 > 0 else last
                if penultimate >= b:  # timestamps come in pairs: text next
                    ban[r, b: e + 1] = True
                else:  # after a single timestamp: another one (not earlier) or EOT
                    ban[r, : self.sp.eot] = True
                    ban[r, b: last] = True
                    check.append(r)
            else:
                check.append(r)
                for tok in reversed(seq[:step]):
                    if tok >= b:  # timestamps never decrease
                        ban[r, b: tok + 1] = True
                        break
        if check:
            logp = torch.log_softmax(logits.masked_fill(ban, float("-inf")), dim=-1)
            for r in check:
                if torch.logsumexp(logp[r, b: e + 1], dim=0) > logp[r, :b].max():
                    ban[r, :b] = True  # the timestamps together outweigh any text token: sample a timestamp


@torch.no_grad()
def greedy_decode(model: WhisperTorch, xa: Tensor, frames: Tensor | None, prompts: list[list[int]],
                  max_lengths: list[int], sp: SpecialTokens, opts: DecodeOptions) -> list[Decoded]:
    """Greedy decode of one prompt per encoder row. ``max_lengths`` is CTranslate2's ``max_length`` per row."""
    device = xa.device
    rows = len(prompts)
    parts = [split_prompt(p, sp) for p in prompts]
    steps = [min(m // 2, m - len(pre)) for (pre, _s, _i), m in zip(parts, max_lengths, strict=True)]
    out = [Decoded() for _ in range(rows)]
    timestamps = [p[-1] != sp.no_timestamps for p in prompts]
    rules = _TimestampRules(sp, opts.max_initial_timestamp_index) if any(timestamps) else None
    cache = model.decoder.start(xa, frames)

    width = max(len(pre) for pre, _s, _i in parts)
    if width:
        tokens = torch.zeros(rows, width, dtype=torch.long)
        valid = torch.zeros(rows, width, dtype=torch.bool)
        positions = torch.zeros(rows, width, dtype=torch.long)
        for r, (pre, _s, _i) in enumerate(parts):
            pad = width - len(pre)
            if pre:
                tokens[r, pad:] = torch.tensor(pre)
                valid[r, pad:] = True
            positions[r] = torch.arange(width) - pad
        h = model.decoder(tokens.to(device), positions.to(device), cache, valid.to(device))
        at_sot = [(r, width - len(pre) + i) for r, (pre, _s, i) in enumerate(parts) if i < len(pre)]
        if at_sot:
            idx = torch.tensor(at_sot, device=device)
            probs = torch.softmax(model.decoder.logits(h[idx[:, 0], idx[:, 1]]), dim=-1)
            for j, (r, _pos) in enumerate(at_sot):
                out[r].no_speech_prob = float(probs[j, sp.no_speech])

    alive = [r for r in range(rows) if steps[r] > 0]
    cache = cache.select(torch.tensor(alive, dtype=torch.long, device=device)) if len(alive) < rows else cache
    current = [parts[r][1] for r in alive]
    step = 0
    while alive:
        cur = torch.tensor(current, device=device)[:, None]
        pos = torch.tensor([len(parts[r][0]) + step for r in alive], device=device)[:, None]
        logits = model.decoder.logits(model.decoder(cur, pos, cache)[:, -1])
        if step == 0:
            first = [j for j, r in enumerate(alive) if parts[r][2] == len(parts[r][0])]  # <|sot|> starts the loop
            if first:
                probs = torch.softmax(logits[first], dim=-1)
                for k, j in enumerate(first):
                    out[alive[j]].no_speech_prob = float(probs[k, sp.no_speech])
        ban = torch.zeros_like(logits, dtype=torch.bool)
        seqs = [out[r].tokens for r in alive]
        for j, seq in enumerate(seqs):
            for tok in _ngram_bans(seq, opts.no_repeat_ngram):
                ban[j, tok] = True
        if opts.suppress:
            ban[:, list(opts.suppress)] = True
        if step == 0 and opts.suppress_begin:
            ban[:, list(opts.suppress_begin)] = True
        if rules is not None:
            ts_rows = [j for j, r in enumerate(alive) if timestamps[r]]
            if ts_rows:
                sub = ban[ts_rows]
                rules.apply(step, [seqs[j] for j in ts_rows], logits[ts_rows], sub)
                ban[ts_rows] = sub
        logp = torch.log_softmax(logits.masked_fill(ban, float("-inf")), dim=-1)
        best = logp.argmax(dim=-1)
        best_lp = logp.gather(1, best[:, None])[:, 0]
        keep, nxt = [], []
        for j, r in enumerate(alive):
            tok = int(best[j])
            out[r].logprob_sum += float(best_lp[j])
            if tok != sp.eot:
                out[r].tokens.append(tok)
            if tok != sp.eot and step + 1 < steps[r]:
                keep.append(j)
                nxt.append(tok)
        if len(keep) < len(alive):
            cache = cache.select(torch.tensor(keep, dtype=torch.long, device=device))
        alive = [alive[j] for j in keep]
        current = nxt
        step += 1
    return out
