"""Silero VAD v6 in torch, batched across streams: every stream's pending 32 ms windows in one call, on any device.

The weights are read at load from the ONNX file faster-whisper bundles (the one models/vad.py runs on onnxruntime);
nothing is downloaded. The graph, read node by node:

- input [windows, 576]: each 512-sample window after the last 64 samples of the window before it (zeros before a
  call's first window);
- STFT as a convolution: reflect-pad 128 samples on each side, conv1d with the 258 x 256 basis at stride 128, keep
  frames 1..4, magnitude of (rows 0..128, rows 129..257) -> [windows, 129, 4] (here one matmul over those frames);
- encoder: four conv1d (kernel 3, padding 1, strides 1, 2, 2, 1; 129 -> 128 -> 64 -> 64 -> 128), each with ReLU
  -> [windows, 128];
- an LSTM (hidden 128) whose time axis is the call's windows in order, state h/c starting at zero each call;
- decoder: ReLU, a 1 x 1 conv (128 -> 1), sigmoid: one speech probability per window.

The encoder runs on every window of every stream at once; the LSTM runs each stream's windows in order, the
streams side by side (padded to the longest; a pad step comes after a stream's last window, so it changes nothing
the stream reads). Each stream's probabilities are those of one ``SileroVAD.probabilities`` call on its audio,
including faster-whisper's zeroing of the last 64 samples of a call's last window (its ``SileroVADModel.__call__``
writes the zeros through a view before building the input), so the GPU engine and the CPU server decide alike.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from .device_call import DeviceCall
from .onnx_weights import read_graph
from .vad import Runner

WINDOW = 512
CONTEXT = 64
HIDDEN = 128
_STRIDES = (1, 2, 2, 1)


def bundled_model_path() -> Path:
    """faster-whisper's Silero v6 ONNX file (the model the CPU server's VAD runs)."""
    from faster_whisper.utils import get_assets_path

    return Path(get_assets_path()) / "silero_vad_v6.onnx"


class SileroV6(nn.Module):
    """The Silero v6 network for 16 kHz audio; ``forward`` takes streams of windows, each with its context."""

    basis: torch.Tensor  # a registered buffer (nn.Module's attribute lookup types it Tensor | Module)

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("basis", torch.zeros(256, 258))  # the STFT's conv kernels as a matrix's columns
        widths = (129, 128, 64, 64, 128)
        self.convs = nn.ModuleList(nn.Conv1d(widths[i], widths[i + 1], 3, stride=s, padding=1)
                                   for i, s in enumerate(_STRIDES))
        self.lstm = nn.LSTM(HIDDEN, HIDDEN, batch_first=True)
        self.out = nn.Conv1d(HIDDEN, 1, 1)

    @classmethod
    def from_onnx(cls, path: str | Path | None = None) -> SileroV6:
        """The network with the weights of the ONNX file at ``path`` (default: the bundled one)."""
        graph = read_graph(bundled_model_path() if path is None else path)
        w = graph.initializers
        model = cls()
        try:
            params = {"basis": w["encoder.feature_extractor.forward_basis_buffer"][:, 0, :].T,
                      "out.weight": w["decoder.conv1d.weight"], "out.bias": w["decoder.conv1d.bias"]}
            for i in range(len(_STRIDES)):
                params[f"convs.{i}.weight"] = w[f"encoder.conv_layers.{i}.weight"]
                params[f"convs.{i}.bias"] = w[f"encoder.conv_layers.{i}.bias"]
            wi, wh, b = (w[name] for name in graph.only("LSTM").inputs[1:4])  # W, R [1, 512, 128]; B [1, 1024]
        except (KeyError, ValueError) as exc:
            raise ValueError(f"not the Silero v6 graph this module reads: {exc}") from exc
        # ONNX orders an LSTM's gates input, output, forget, cell; torch input, forget, cell, output
        params["lstm.weight_ih_l0"] = _torch_gates(wi[0])
        params["lstm.weight_hh_l0"] = _torch_gates(wh[0])
        params["lstm.bias_ih_l0"] = _torch_gates(b[0, : 4 * HIDDEN])
        params["lstm.bias_hh_l0"] = _torch_gates(b[0, 4 * HIDDEN:])
        model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in params.items()})
        return model.eval()

    def encode(self, frames: torch.Tensor) -> torch.Tensor:
        """[n, 576] windows with their context -> [n, 128] features (no state: any windows, any order)."""
        x = nn.functional.pad(frames.unsqueeze(1), (128, 128), mode="reflect").squeeze(1)
        # the graph's conv (kernel 256, stride 128) as one matmul over the frames it keeps: 1..4 of 0..4
        spec = x.unfold(1, 256, 128)[:, 1:] @ self.basis  # [n, 4, 258]
        x = torch.sqrt(spec[..., :129].pow(2) + spec[..., 129:].pow(2)).transpose(1, 2)
        for conv in self.convs:
            x = torch.relu(conv(x))
        return x.squeeze(2)

    def decode(self, features: torch.Tensor) -> torch.Tensor:
        """[streams, steps, 128] features in time order -> [streams, steps] speech probabilities (state from zero)."""
        y, _ = self.lstm(features)
        return torch.sigmoid(self.out(torch.relu(y).transpose(1, 2))).squeeze(1)


def _torch_gates(a: np.ndarray) -> np.ndarray:
    i, o, f, c = np.split(a, 4, axis=0)
    return np.concatenate([i, f, c, o], axis=0)


def with_context(windows: torch.Tensor, starts: torch.Tensor, lasts: torch.Tensor) -> torch.Tensor:
    """[n, 512] windows of several calls, one after the other -> [n, 576]: each window after the last 64 samples
    of the window before it in its call (zeros for a call's first window, ``starts``); the last 64 samples of each
    call's last window (``lasts``) are zero, as faster-whisper's call makes them."""
    x = windows.clone()
    x[lasts, WINDOW - CONTEXT:] = 0.0
    ctx = torch.zeros(x.shape[0], CONTEXT, dtype=x.dtype, device=x.device)
    ctx[1:] = x[:-1, WINDOW - CONTEXT:]
    ctx[starts] = 0.0
    return torch.cat([ctx, x], dim=1)


class _Batch:
    """One call's layout on the host: the windows of every stream, one after the other, and where each sits."""

    def __init__(self, audio: list[np.ndarray]) -> None:
        self.counts = np.array([len(a) // WINDOW for a in audio], dtype=np.int64)
        ends = np.cumsum(self.counts)
        total = int(ends[-1]) if len(ends) else 0
        self.windows = np.empty((total, WINDOW), dtype=np.float32)
        for a, n, end in zip(audio, self.counts, ends, strict=True):
            self.windows[end - n: end] = np.asarray(a[: n * WINDOW], dtype=np.float32).reshape(n, WINDOW)
        live = self.counts > 0
        self.starts = (ends - self.counts)[live]
        self.lasts = ends[live] - 1
        self.rows = np.repeat(np.arange(int(live.sum())), self.counts[live])  # padded row of each window
        self.steps = np.arange(total) - np.repeat(self.starts, self.counts[live])  # its step in that row
        self.shape = (int(live.sum()), int(self.counts.max(initial=0)))

    def tensors(self) -> list[torch.Tensor]:
        return [torch.from_numpy(a) for a in (self.windows, self.starts, self.lasts, self.rows, self.steps)]

    def split(self, prob: np.ndarray) -> list[np.ndarray]:
        return np.split(prob, np.cumsum(self.counts)[:-1])


def _probabilities(model: SileroV6, batch: _Batch, windows: torch.Tensor, starts: torch.Tensor,
                   lasts: torch.Tensor, rows: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    features = model.encode(with_context(windows, starts, lasts))
    padded = features.new_zeros(*batch.shape, HIDDEN)
    padded[rows, steps] = features
    return model.decode(padded)[rows, steps]


def silero_vad(device: torch.device | str, model: SileroV6 | None = None) -> Runner:
    """A batch runner (serving/threads.py Runner) for the executor's VAD lane: each item is one stream's pending
    audio at 16 kHz (a trailing partial window is left out), each result that audio's per-window probabilities.
    On CUDA the call runs on a stream of its own and waits for its result on an event (device_call.wait), so
    Python's lock is free during the wait (as energy_vad does)."""
    net = (SileroV6.from_onnx() if model is None else model).to(torch.device(device))
    call = DeviceCall(device)  # after the weights' copies: its stream reads them once they are there

    @torch.inference_mode()
    def run(audio: list[np.ndarray]) -> list[np.ndarray]:
        batch = _Batch(audio)
        if batch.windows.shape[0] == 0:
            return [np.zeros(0, dtype=np.float32) for _ in audio]
        return batch.split(call(lambda *on_dev: _probabilities(net, batch, *on_dev), *batch.tensors()))

    return run
