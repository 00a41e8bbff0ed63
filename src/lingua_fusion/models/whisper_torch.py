"""Whisper in plain torch, with OpenAI whisper's module layout, plus its log-mel frontend.

The layout is a contract (the GPU engine in serving/gpu builds its paged cache on it):
``WhisperTorch.encoder``: ``conv1``, ``conv2``, buffer ``positional_embedding``, ``blocks[i]`` (``attn_ln``, ``attn``
with ``query`` / ``key`` (no bias) / ``value`` / ``out``, ``mlp_ln``, ``mlp`` = Linear-GELU-Linear), ``ln_post``;
``WhisperTorch.decoder``: ``token_embedding``, parameter ``positional_embedding``, ``blocks[i]`` (``attn_ln``,
``attn``, ``cross_attn_ln``, ``cross_attn``, ``mlp_ln``, ``mlp``), ``ln``; logits = x @ token_embedding.weight.T.

Differences from OpenAI's code: attention is ``scaled_dot_product_attention``; the encoder takes trimmed windows (the
positional table is cut to the input) and a batch of windows of different lengths (``frames``: padded frames are
masked out of attention, so each row equals its window encoded alone); the decoder's KV cache is explicit
(``KVCache``) with per-row positions, so rows with prompts of different lengths share a batch (left padding, masked).
Works in float32 on the CPU and float16 / bfloat16 on CUDA (layer norms and logits in float32).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .host_copy import queued_copy
from .whisper_ct2 import WhisperDims, WhisperGenConfig, read_ct2, read_gen_config, state_dict, whisper_dims

__all__ = ["KVCache", "LogMel", "WhisperDims", "WhisperTorch", "load_whisper", "mel_filters"]

SAMPLE_RATE = 16000
N_FFT = 400
HOP = 160


class LayerNorm(nn.LayerNorm):
    """Computed in float32 whatever the model's dtype (as OpenAI's), then cast back."""

    def forward(self, x: Tensor) -> Tensor:
        w = None if self.weight is None else self.weight.float()
        b = None if self.bias is None else self.bias.float()
        return F.layer_norm(x.float(), self.normalized_shape, w, b, self.eps).type(x.dtype)


def sinusoids(length: int, channels: int, max_timescale: float = 10000) -> Tensor:
    """OpenAI's encoder position table (the shipped weights carry it too)."""
    inc = np.log(max_timescale) / (channels // 2 - 1)
    inv = torch.exp(-inc * torch.arange(channels // 2))
    t = torch.arange(length)[:, None] * inv[None, :]
    return torch.cat([torch.sin(t), torch.cos(t)], dim=1)


class MultiHeadAttention(nn.Module):
    def __init__(self, n_state: int, n_head: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.query = nn.Linear(n_state, n_state)
        self.key = nn.Linear(n_state, n_state, bias=False)
        self.value = nn.Linear(n_state, n_state)
        self.out = nn.Linear(n_state, n_state)

    def _heads(self, x: Tensor) -> Tensor:  # [B, T, D] -> [B, H, T, D/H]
        b, t, d = x.shape
        return x.view(b, t, self.n_head, d // self.n_head).transpose(1, 2)

    def kv(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of ``x`` in head layout (for the cache, or cross-attention once per clip)."""
        return self._heads(self.key(x)), self._heads(self.value(x))

    def attend(self, x: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """Queries from ``x`` over (k, v); ``mask`` is boolean, True where a query may look, broadcast to scores."""
        o = F.scaled_dot_product_attention(self._heads(self.query(x)), k, v, attn_mask=mask)
        b, _h, t, _dh = o.shape
        return self.out(o.transpose(1, 2).reshape(b, t, -1))

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        return self.attend(x, *self.kv(x), mask)


class ResidualAttentionBlock(nn.Module):
    def __init__(self, n_state: int, n_head: int, cross_attention: bool = False) -> None:
        super().__init__()
        self.attn = MultiHeadAttention(n_state, n_head)
        self.attn_ln = LayerNorm(n_state)
        self.cross_attn = MultiHeadAttention(n_state, n_head) if cross_attention else None
        self.cross_attn_ln = LayerNorm(n_state) if cross_attention else None
        self.mlp = nn.Sequential(nn.Linear(n_state, 4 * n_state), nn.GELU(), nn.Linear(4 * n_state, n_state))
        self.mlp_ln = LayerNorm(n_state)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:  # the encoder's block
        x = x + self.attn(self.attn_ln(x), mask)
        return x + self.mlp(self.mlp_ln(x))

    def step(self, x: Tensor, past: tuple[Tensor, Tensor] | None, cross: tuple[Tensor, Tensor],
             mask: Tensor, cross_mask: Tensor | None) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """The decoder's block over new tokens ``x``; returns the output and this layer's grown (k, v)."""
        assert self.cross_attn is not None and self.cross_attn_ln is not None
        h = self.attn_ln(x)
        k, v = self.attn.kv(h)
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        x = x + self.attn.attend(h, k, v, mask)
        x = x + self.cross_attn.attend(self.cross_attn_ln(x), cross[0], cross[1], cross_mask)
        return x + self.mlp(self.mlp_ln(x)), (k, v)


class AudioEncoder(nn.Module):
    positional_embedding: Tensor  # registered buffers: nn.Module's attribute lookup types them Tensor | Module

    def __init__(self, n_mels: int, n_ctx: int, n_state: int, n_head: int, n_layer: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(n_mels, n_state, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(n_state, n_state, kernel_size=3, stride=2, padding=1)
        self.register_buffer("positional_embedding", sinusoids(n_ctx, n_state))
        self.blocks = nn.ModuleList([ResidualAttentionBlock(n_state, n_head) for _ in range(n_layer)])
        self.ln_post = LayerNorm(n_state)

    def forward(self, mel: Tensor, frames: Tensor | None = None, *, always_mask: bool = False) -> Tensor:
        """mel [B, n_mels, T] (T <= 3000, even) -> [B, T/2, D]. ``frames`` [B]: each row's own window length in mel
        frames (even); the rest of a row must be zeros and is masked (``key_mask(frames)`` gives the mask).
        Without padding no mask is passed, which takes a read of ``frames`` on the host; ``always_mask`` passes it
        anyway and reads nothing back (what a CUDA graph of the encoder needs: serving/gpu/encoder_graphs.py)."""
        x = F.gelu(self.conv1(mel))
        x = F.gelu(self.conv2(x)).permute(0, 2, 1)
        pos = self.positional_embedding
        if x.shape[1] > pos.shape[0]:
            raise ValueError(f"{mel.shape[-1]} mel frames is more than the model's {2 * pos.shape[0]}")
        x = (x + pos[: x.shape[1]]).to(x.dtype)
        mask = None
        if frames is not None and (always_mask or bool((frames < mel.shape[-1]).any())):
            mask = self.key_mask(frames, x.shape[1])[:, None, None, :]
        for block in self.blocks:
            x = block(x, mask)
        return self.ln_post(x)

    @staticmethod
    def key_mask(frames: Tensor, width: int) -> Tensor:
        """[B, width] True for the encoder positions that belong to each row's window."""
        return torch.arange(width, device=frames.device)[None, :] < (frames[:, None] // 2)


@dataclass
class KVCache:
    """A dense decoder cache: per layer (k, v) [B, H, T, D/H] growing by one step at a time, and ``valid`` [B, T]
    (False at left-padding). Cross-attention (k, v) are computed once per clip and kept in ``cross``."""

    cross: list[tuple[Tensor, Tensor]]
    cross_mask: Tensor | None  # [B, 1, 1, S] or None when every row uses the whole encoder output
    layers: list[tuple[Tensor, Tensor]] = field(default_factory=list)
    valid: Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.valid is None else int(self.valid.shape[1])

    def select(self, rows: Tensor) -> KVCache:
        """The cache of the rows ``rows`` only (finished rows leave the batch)."""
        return KVCache([(k[rows], v[rows]) for k, v in self.cross],
                       None if self.cross_mask is None else self.cross_mask[rows],
                       [(k[rows], v[rows]) for k, v in self.layers],
                       None if self.valid is None else self.valid[rows])


class TextDecoder(nn.Module):
    def __init__(self, n_vocab: int, n_ctx: int, n_state: int, n_head: int, n_layer: int) -> None:
        super().__init__()
        self.token_embedding = nn.Embedding(n_vocab, n_state)
        self.positional_embedding = nn.Parameter(torch.zeros(n_ctx, n_state))
        self.blocks = nn.ModuleList([ResidualAttentionBlock(n_state, n_head, cross_attention=True)
                                     for _ in range(n_layer)])
        self.ln = LayerNorm(n_state)

    def start(self, xa: Tensor, frames: Tensor | None = None) -> KVCache:
        """An empty cache for encoder output ``xa`` [B, S, D], with cross-attention K/V computed once."""
        cross = []
        for block in self.blocks:
            assert isinstance(block, ResidualAttentionBlock) and block.cross_attn is not None  # (a ModuleList's)
            cross.append(block.cross_attn.kv(xa))
        mask = None
        if frames is not None and bool((frames // 2 < xa.shape[1]).any()):
            mask = AudioEncoder.key_mask(frames, xa.shape[1])[:, None, None, :]
        return KVCache(cross, mask)

    def forward(self, tokens: Tensor, positions: Tensor, cache: KVCache, valid: Tensor | None = None) -> Tensor:
        """tokens, positions [B, T] (new tokens; positions per row); ``valid`` [B, T] False at padding. Grows
        ``cache`` by T and returns the final hidden states [B, T, D] (``logits`` turns them into scores)."""
        b, t = tokens.shape
        valid = torch.ones(b, t, dtype=torch.bool, device=tokens.device) if valid is None else valid
        past_len = cache.length
        keys = valid if cache.valid is None else torch.cat([cache.valid, valid], dim=1)
        q_pos = torch.arange(past_len, past_len + t, device=tokens.device)
        k_pos = torch.arange(past_len + t, device=tokens.device)
        causal = k_pos[None, :] <= q_pos[:, None]  # [T, K]
        # a padded query looks at itself only, so no row of scores is empty (SDPA would give NaN there)
        mask = (causal[None] & keys[:, None, :]) | (k_pos[None, None, :] == q_pos[None, :, None])
        mask = mask[:, None]  # [B, 1, T, K]
        x = self.token_embedding(tokens) + self.positional_embedding[positions.clamp(min=0)]
        x = x.to(self.token_embedding.weight.dtype)
        new_layers = []
        for i, block in enumerate(self.blocks):
            assert isinstance(block, ResidualAttentionBlock)  # (a ModuleList's items are typed Module)
            x, kv = block.step(x, cache.layers[i] if cache.layers else None, cache.cross[i], mask, cache.cross_mask)
            new_layers.append(kv)
        cache.layers, cache.valid = new_layers, keys
        return self.ln(x)

    def logits(self, h: Tensor) -> Tensor:
        return (h @ self.token_embedding.weight.T).float()


class WhisperTorch(nn.Module):
    def __init__(self, dims: WhisperDims, gen: WhisperGenConfig | None = None) -> None:
        super().__init__()
        self.dims = dims
        self.gen = gen or WhisperGenConfig()
        self.encoder = AudioEncoder(dims.n_mels, dims.n_audio_ctx, dims.n_audio_state, dims.n_audio_head,
                                    dims.n_audio_layer)
        self.decoder = TextDecoder(dims.n_vocab, dims.n_text_ctx, dims.n_text_state, dims.n_text_head,
                                   dims.n_text_layer)

    @property
    def is_multilingual(self) -> bool:
        return self.dims.is_multilingual

    def embed_audio(self, mel: Tensor, frames: Tensor | None = None) -> Tensor:
        encoded: Tensor = self.encoder(mel, frames)  # nn.Module's __call__ is typed Any
        return encoded


def load_whisper(model_dir: Path, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32) -> WhisperTorch:
    """The Whisper of a CTranslate2 model directory (model.bin + config.json) as a torch module, in eval mode."""
    ct2 = read_ct2(Path(model_dir) / "model.bin")
    with torch.device("meta"):  # no random init, no second copy: the loaded tensors become the parameters
        model = WhisperTorch(whisper_dims(ct2), read_gen_config(Path(model_dir)))
    model.load_state_dict(state_dict(ct2), strict=True, assign=True)
    return model.to(device=device, dtype=dtype).eval()


# ---- log-mel frontend ---------------------------------------------------------------------------------------
def mel_filters(n_mels: int, sr: int = SAMPLE_RATE, n_fft: int = N_FFT) -> np.ndarray:
    """Slaney-style mel filterbank [n_mels, 1 + n_fft/2], as faster-whisper's FeatureExtractor builds it."""
    fftfreqs = np.fft.rfftfreq(n=n_fft, d=1.0 / sr)
    mels = np.linspace(0.0, 45.245640471924965, n_mels + 2)
    f_sp = 200.0 / 3
    freqs = f_sp * mels
    min_log_hz, min_log_mel, logstep = 1000.0, 1000.0 / f_sp, np.log(6.4) / 27.0
    log_t = mels >= min_log_mel
    freqs[log_t] = min_log_hz * np.exp(logstep * (mels[log_t] - min_log_mel))
    fdiff = np.diff(freqs)
    ramps = freqs.reshape(-1, 1) - fftfreqs.reshape(1, -1)
    lower = -ramps[:-2] / np.expand_dims(fdiff[:-1], axis=1)
    upper = ramps[2:] / np.expand_dims(fdiff[1:], axis=1)
    weights = np.maximum(np.zeros_like(lower), np.minimum(lower, upper))
    weights *= np.expand_dims(2.0 / (freqs[2: n_mels + 2] - freqs[:n_mels]), axis=1)
    return weights.astype(np.float32)


class LogMel(nn.Module):
    """Whisper's log-mel spectrogram in torch: faster-whisper's FeatureExtractor (160 zeros appended, centred
    reflect-padded STFT, last frame dropped, log10, floor at max - 8, (x + 4) / 4), on whatever device it lives."""

    window: Tensor  # registered buffers (as AudioEncoder's)
    filters: Tensor

    def __init__(self, n_mels: int) -> None:
        super().__init__()
        self.register_buffer("window", torch.hann_window(N_FFT), persistent=False)
        self.register_buffer("filters", torch.from_numpy(mel_filters(n_mels)), persistent=False)

    def forward(self, audio: Tensor, padding: int = HOP) -> Tensor:
        """audio [B, N] float32 (every row the same length) -> [B, n_mels, N/160 + 1]."""
        x = F.pad(audio.float(), (0, padding)) if padding else audio.float()
        spec = torch.stft(x, N_FFT, HOP, window=self.window, center=True, pad_mode="reflect", return_complex=True)
        power = spec[..., :-1].abs() ** 2
        log_spec = torch.log10(torch.clamp(self.filters @ power, min=1e-10))
        peak = log_spec.amax(dim=(-2, -1), keepdim=True)
        return (torch.maximum(log_spec, peak - 8.0) + 4.0) / 4.0

    def ragged(self, clips: list[np.ndarray], widths: list[int] | None = None) -> tuple[Tensor, list[int]]:
        """Clips of any lengths in one call: ([B, n_mels, most frames], each clip's frames). Row ``i`` is
        ``forward`` of clip ``i`` alone (its own peak and floor), zeros past its frames. The centring reflection is
        done per clip on the host, so the device sees one copy and one STFT for the batch, not one per clip.
        ``widths``: each clip zero-padded to that many samples first (at least its length), without a copy of it."""
        half = N_FFT // 2
        sizes = widths if widths is not None else [len(c) for c in clips]
        frames = [(n + HOP) // HOP for n in sizes]  # forward's frame count: (n + HOP) / HOP + 1, less the last
        host = np.zeros((len(clips), max(sizes) + HOP + N_FFT), dtype=np.float32)
        for row, c, n in zip(host, clips, sizes, strict=True):
            padded = n + HOP  # the clip, its zeros to n and HOP more, at row[half:], reflected at both ends
            if padded <= half + 1:  # shorter than the reflection: numpy's repeated reflection
                row[: padded + N_FFT] = np.pad(np.pad(np.asarray(c, dtype=np.float32), (0, padded - len(c))), half,
                                               "reflect")
                continue
            row[half: half + len(c)] = c  # one copy of the clip; the rest is slices of the row itself
            row[:half] = row[2 * half: half: -1]
            row[half + padded: padded + N_FFT] = row[half + padded - 2: padded - 2: -1]
        x = torch.from_numpy(host).to(self.window.device, non_blocking=True)
        spec = torch.stft(x, N_FFT, HOP, window=self.window, center=False, return_complex=True)[..., : max(frames)]
        log_spec = torch.log10(torch.clamp(self.filters @ (spec.abs() ** 2), min=1e-10))
        counts = queued_copy(torch.tensor(frames), x.device)  # (a list as such is copied the waiting way)
        valid = torch.arange(max(frames), device=x.device) < counts[:, None]
        peak = log_spec.masked_fill(~valid[:, None, :], float("-inf")).amax(dim=(-2, -1), keepdim=True)
        return ((torch.maximum(log_spec, peak - 8.0) + 4.0) / 4.0).masked_fill(~valid[:, None, :], 0.0), frames
