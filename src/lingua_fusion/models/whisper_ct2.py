"""Read a CTranslate2 Whisper ``model.bin`` (and its ``config.json``) into float tensors with OpenAI's names.

The binary format (CTranslate2 ``specs/model_spec.py`` ``_serialize``, binary version 6), little-endian:

    u32 version | str spec name | u32 revision | u32 n
    n x (str name | u8 rank | rank x u32 dim | u8 dtype | u32 nbytes | nbytes of data)
    u32 n_alias | n_alias x (str alias | str target)

where ``str`` is a u16 length (including a NUL) then the UTF-8 bytes and the NUL; dtype ids are 0 float32, 1 int8,
2 int16, 3 int32, 4 float16, 5 bfloat16. A quantised weight ``.../weight`` comes with ``.../weight_scale``: int8
has one scale per output row (``w = q / scale``), int16 one scalar. The shipped tiny.en and base files hold float16
weights; CTranslate2 quantises them to int8 when it loads them with ``compute_type="int8"``. No torch import here
except in ``state_dict``, so the reader also serves tools that only need numpy.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# type id -> (name, how the bytes are read); bfloat16 is read as raw 16-bit words
_DTYPES: dict[int, tuple[str, np.dtype[np.generic]]] = {
    0: ("float32", np.dtype("<f4")), 1: ("int8", np.dtype("i1")), 2: ("int16", np.dtype("<i2")),
    3: ("int32", np.dtype("<i4")), 4: ("float16", np.dtype("<f2")), 5: ("bfloat16", np.dtype("<u2"))}


@dataclass(frozen=True)
class Ct2Variable:
    name: str
    shape: tuple[int, ...]
    dtype: str  # float32 | int8 | int16 | int32 | float16 | bfloat16
    data: np.ndarray  # as stored (bfloat16 as uint16)


@dataclass
class Ct2Model:
    spec: str
    revision: int
    variables: dict[str, Ct2Variable]
    aliases: dict[str, str] = field(default_factory=dict)

    def scalar(self, name: str) -> int:
        return int(self.variables[name].data.reshape(-1)[0])

    def float_tensor(self, name: str) -> np.ndarray:
        """``name`` as float32, dequantised when the file stores it quantised with a ``<name>_scale``."""
        name = self.aliases.get(name, name)
        var = self.variables[name]
        if var.dtype == "bfloat16":
            return (var.data.astype(np.uint32) << 16).view(np.float32).reshape(var.shape)
        value = var.data.astype(np.float32).reshape(var.shape)
        scale_var = self.variables.get(name + "_scale")
        if var.dtype in ("int8", "int16") and scale_var is not None:
            scale = scale_var.data.astype(np.float32)
            if scale.size == 1:
                return value / scale.reshape(())
            return value / scale.reshape((-1,) + (1,) * (value.ndim - 1))  # one scale per output row
        return value


def read_ct2(path: Path) -> Ct2Model:
    """Parse ``path`` (a CTranslate2 model.bin). Arrays are views into one read of the file."""
    buf = memoryview(Path(path).read_bytes())
    pos = 0

    def take(fmt: str) -> Any:
        nonlocal pos
        out = struct.unpack_from("<" + fmt, buf, pos)
        pos += struct.calcsize("<" + fmt)
        return out[0] if len(out) == 1 else out

    def text() -> str:
        nonlocal pos
        n = take("H")
        s = bytes(buf[pos:pos + n - 1]).decode("utf-8")
        pos += n
        return s

    version = take("I")
    if version < 5 or version > 6:
        raise ValueError(f"{path}: CTranslate2 binary version {version} is not supported (5-6)")
    spec, revision, count = text(), take("I"), take("I")
    variables: dict[str, Ct2Variable] = {}
    for _ in range(count):
        name = text()
        rank = take("B")
        shape = tuple(int(take("I")) for _ in range(rank))
        type_id, nbytes = take("B"), take("I")
        type_name, dtype = _DTYPES[type_id]
        data = np.frombuffer(buf, dtype=dtype, count=nbytes // dtype.itemsize, offset=pos)
        pos += nbytes
        variables[name] = Ct2Variable(name, shape, type_name, data)
    aliases = {}
    for _ in range(take("I")):
        alias = text()
        aliases[alias] = text()
    if pos != len(buf):
        raise ValueError(f"{path}: {len(buf) - pos} trailing bytes after the variables")
    return Ct2Model(spec, revision, variables, aliases)


@dataclass(frozen=True)
class WhisperDims:
    """OpenAI Whisper's ModelDimensions, read from the weights' shapes and head counts."""

    n_mels: int
    n_audio_ctx: int
    n_audio_state: int
    n_audio_head: int
    n_audio_layer: int
    n_vocab: int
    n_text_ctx: int
    n_text_state: int
    n_text_head: int
    n_text_layer: int

    @property
    def is_multilingual(self) -> bool:
        return self.n_vocab >= 51865

    @property
    def num_languages(self) -> int:
        return self.n_vocab - 51765 - int(self.is_multilingual)


@dataclass(frozen=True)
class WhisperGenConfig:
    """Decoding lists from the model directory's config.json (what CTranslate2 reads for suppress_tokens=[-1])."""

    suppress_ids: tuple[int, ...] = ()
    suppress_ids_begin: tuple[int, ...] = ()
    lang_ids: tuple[int, ...] = ()
    alignment_heads: tuple[tuple[int, int], ...] = ()


def _layers(model: Ct2Model, prefix: str) -> int:
    n = 0
    while f"{prefix}/layer_{n}/ffn/linear_0/weight" in model.variables:
        n += 1
    return n


def whisper_dims(model: Ct2Model) -> WhisperDims:
    if model.spec != "WhisperSpec":
        raise ValueError(f"not a Whisper model: spec {model.spec}")
    conv1 = model.variables["encoder/conv1/weight"].shape
    enc_pos = model.variables["encoder/position_encodings/encodings"].shape
    emb = model.variables["decoder/embeddings/weight"].shape
    dec_pos = model.variables["decoder/position_encodings/encodings"].shape
    return WhisperDims(n_mels=conv1[1], n_audio_ctx=enc_pos[0], n_audio_state=conv1[0],
                       n_audio_head=model.scalar("encoder/num_heads"), n_audio_layer=_layers(model, "encoder"),
                       n_vocab=emb[0], n_text_ctx=dec_pos[0], n_text_state=emb[1],
                       n_text_head=model.scalar("decoder/num_heads"), n_text_layer=_layers(model, "decoder"))


def read_gen_config(model_dir: Path) -> WhisperGenConfig:
    path = Path(model_dir) / "config.json"
    if not path.exists():
        return WhisperGenConfig()
    cfg = json.loads(path.read_text())
    return WhisperGenConfig(tuple(cfg.get("suppress_ids") or ()), tuple(cfg.get("suppress_ids_begin") or ()),
                            tuple(cfg.get("lang_ids") or ()),
                            tuple(tuple(h) for h in cfg.get("alignment_heads") or ()))  # type: ignore[misc]


def state_dict(model: Ct2Model) -> dict[str, Any]:
    """A float32 torch state dict with OpenAI Whisper's parameter names (``WhisperTorch.load_state_dict``)."""
    import torch

    dims = whisper_dims(model)
    out: dict[str, torch.Tensor] = {}

    def put(dst: str, src: str) -> None:
        out[dst] = torch.from_numpy(np.ascontiguousarray(model.float_tensor(src)))

    def linear(dst: str, src: str, part: int = 0, parts: int = 1) -> None:
        """``dst`` from rows ``part`` of ``parts`` equal slices of ``src`` (CTranslate2 fuses q/k/v and k/v)."""
        w = model.float_tensor(src + "/weight")
        n = w.shape[0] // parts
        out[dst + ".weight"] = torch.from_numpy(np.ascontiguousarray(w[part * n:(part + 1) * n]))
        # Whisper's key projection has no bias (one added to keys shifts all scores of a query alike)
        if not dst.endswith(".key") and src + "/bias" in model.variables:
            b = model.float_tensor(src + "/bias")
            out[dst + ".bias"] = torch.from_numpy(np.ascontiguousarray(b[part * n:(part + 1) * n]))

    def norm(dst: str, src: str) -> None:
        put(dst + ".weight", src + "/gamma")
        put(dst + ".bias", src + "/beta")

    def block(dst: str, src: str, cross: bool) -> None:
        norm(f"{dst}.attn_ln", f"{src}/self_attention/layer_norm")
        for i, name in enumerate(("query", "key", "value")):
            linear(f"{dst}.attn.{name}", f"{src}/self_attention/linear_0", i, 3)
        linear(f"{dst}.attn.out", f"{src}/self_attention/linear_1")
        if cross:
            norm(f"{dst}.cross_attn_ln", f"{src}/attention/layer_norm")
            linear(f"{dst}.cross_attn.query", f"{src}/attention/linear_0")
            linear(f"{dst}.cross_attn.key", f"{src}/attention/linear_1", 0, 2)
            linear(f"{dst}.cross_attn.value", f"{src}/attention/linear_1", 1, 2)
            linear(f"{dst}.cross_attn.out", f"{src}/attention/linear_2")
        norm(f"{dst}.mlp_ln", f"{src}/ffn/layer_norm")
        linear(f"{dst}.mlp.0", f"{src}/ffn/linear_0")
        linear(f"{dst}.mlp.2", f"{src}/ffn/linear_1")

    for conv in ("conv1", "conv2"):
        put(f"encoder.{conv}.weight", f"encoder/{conv}/weight")
        put(f"encoder.{conv}.bias", f"encoder/{conv}/bias")
    put("encoder.positional_embedding", "encoder/position_encodings/encodings")
    for i in range(dims.n_audio_layer):
        block(f"encoder.blocks.{i}", f"encoder/layer_{i}", cross=False)
    norm("encoder.ln_post", "encoder/layer_norm")
    put("decoder.token_embedding.weight", "decoder/embeddings/weight")
    put("decoder.positional_embedding", "decoder/position_encodings/encodings")
    for i in range(dims.n_text_layer):
        block(f"decoder.blocks.{i}", f"decoder/layer_{i}", cross=True)
    norm("decoder.ln", "decoder/layer_norm")
    return out
