"""A user's MT model directory for the GPU benchmark: the Marian architecture (OPUS-MT's size) with random weights
and a SentencePiece vocabulary trained on text this repository has, loaded by the server as any user's directory
(``LINGUAFUSION_MODELS__USER_MT_DIRS``, models/mt_local.py).

    .venv/bin/python bench/gpu_mt_dir.py vocab .gpurun/mt-en-es     # here: the tokenizer files (< 1 MiB, they travel)
    python3 bench/gpu_mt_dir.py model .gpurun/mt-en-es              # there: random weights (300 MB, they cannot)
    .venv/bin/python bench/gpu_mt_dir.py model DIR --size tiny      # a tiny one, to try the path on the CPU

No Marian weights can travel to the GPU machine (64 MiB a call), and none ship with the product, so the figures
are of the architecture's cost, not of a translation's quality: the JSON says ``weights: random``. Random weights
never emit end-of-sentence; the directory's generation config caps every translation at ``--max-new-tokens`` (24:
a spoken sentence of the benchmark's talk clip is 8 to 11 words, about 15 Spanish tokens, so the cap over-counts
the decode work), which the engine obeys as ``generate`` does (models/mt_local.py ``new_token_limit``).

The vocabulary: SentencePiece unigram models (source English, target Spanish) trained on the docs' prose and the
evaluation sets, Spanish from the evaluation sets and Apertium's translation of the English; ``vocab.json`` maps
their pieces to ids and is padded to OPUS-MT en-es's size (``--vocab``) so the output projection costs what the
real one does.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SIZES = {"base": (512, 6, 8), "tiny": (32, 1, 2)}  # d_model, layers, heads (opus-mt-en-es is base)
SPECIAL = ("</s>", "<unk>")  # Marian's: end-of-sentence 0, unknown 1; <pad> is the last id


def corpus() -> tuple[list[str], list[str]]:
    """English and Spanish sentences from this checkout: the docs and the evaluation sets."""
    english: list[str] = []
    for md in sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]:
        for line in md.read_text().splitlines():
            line = re.sub(r"[`*|#>\[\]()]", " ", line).strip()
            if len(line.split()) >= 4 and not line.startswith(("-", "```")):
                english.append(line)
    spanish: list[str] = []
    for tsv in sorted((ROOT / "src/lingua_fusion/lab/eval/data").glob("*.tsv")):
        for row in tsv.read_text().splitlines()[1:]:
            cols = row.split("\t")
            if len(cols) >= 2:
                english.append(cols[0])
                spanish.append(cols[1])
    try:  # Apertium's Spanish for a share of the English (its quality does not matter: only the pieces do)
        sample = "\n".join(english[::4])
        spanish += subprocess.run(["apertium", "-u", "eng-spa"], input=sample, capture_output=True, text=True,
                                  timeout=300, check=True).stdout.splitlines()
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"no Apertium ({exc}): the Spanish vocabulary is trained on the evaluation sets only", file=sys.stderr)
    return english, [s for s in spanish if s.strip()]


def train(lines: list[str], size: int) -> bytes:
    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=model, vocab_size=size,
                                   model_type="unigram", hard_vocab_limit=False, character_coverage=1.0,
                                   unk_id=0, bos_id=-1, eos_id=1, pad_id=-1, minloglevel=2)
    return model.getvalue()


def write_vocab(out: Path, vocab_size: int, pieces: int, max_new_tokens: int, name: str) -> None:
    import sentencepiece as spm

    out.mkdir(parents=True, exist_ok=True)
    english, spanish = corpus()
    source, target = train(english, pieces), train(spanish, pieces)
    (out / "source.spm").write_bytes(source)
    (out / "target.spm").write_bytes(target)
    seen: dict[str, int] = {s: i for i, s in enumerate(SPECIAL)}
    for blob in (source, target):
        sp = spm.SentencePieceProcessor(model_proto=blob)
        for i in range(sp.get_piece_size()):
            seen.setdefault(sp.id_to_piece(i), len(seen))
    pieces, n = len(seen), 0
    while len(seen) < vocab_size - 1:  # OPUS-MT's vocabulary size: the output projection's real cost; as words
        filler = f"\u2581w{n}"  # ("w123") a random model's output reads as a sentence's length, not as markup
        n += 1
        seen.setdefault(filler, len(seen))
    seen["<pad>"] = vocab_size - 1
    (out / "vocab.json").write_text(json.dumps(seen, ensure_ascii=False))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "MarianTokenizer", "source_lang": "en", "target_lang": "es", "model_max_length": 512,
        "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}))
    (out / "linguafusion.json").write_text(json.dumps({
        "name": name, "pairs": [["en", "es"]], "licence": "benchmark only: random weights",
        "weights": "random", "max_new_tokens": max_new_tokens}))
    print(f"{out}: {len(english)} English and {len(spanish)} Spanish lines, {len(seen)} ids "
          f"({pieces} pieces)")


def write_model(out: Path, size: str, seed: int, max_new_tokens: int) -> None:
    import torch
    from transformers import GenerationConfig, MarianConfig, MarianMTModel

    vocab = len(json.loads((out / "vocab.json").read_text()))
    d, layers, heads = SIZES[size]
    torch.manual_seed(seed)
    cfg = MarianConfig(vocab_size=vocab, decoder_vocab_size=vocab, d_model=d, encoder_layers=layers,
                       decoder_layers=layers, encoder_attention_heads=heads, decoder_attention_heads=heads,
                       encoder_ffn_dim=4 * d, decoder_ffn_dim=4 * d, max_position_embeddings=512,
                       pad_token_id=vocab - 1, eos_token_id=0, decoder_start_token_id=vocab - 1,
                       forced_eos_token_id=0, scale_embedding=True, share_encoder_decoder_embeddings=True)
    model = MarianMTModel(cfg).eval()
    model.generation_config = GenerationConfig(
        decoder_start_token_id=vocab - 1, eos_token_id=0, pad_token_id=vocab - 1, forced_eos_token_id=0,
        bad_words_ids=[[vocab - 1]], num_beams=1, max_length=512, max_new_tokens=max_new_tokens)
    model.save_pretrained(out)
    params = sum(p.numel() for p in model.parameters())
    print(f"{out}: Marian {size} (d_model {d}, {layers}+{layers} layers), {params / 1e6:.1f} M parameters, "
          f"vocabulary {vocab}, random weights (seed {seed}), at most {max_new_tokens} new tokens")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["vocab", "model"])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--vocab", type=int, default=65001, help="ids in vocab.json (opus-mt-en-es: 65001)")
    ap.add_argument("--pieces", type=int, default=8000, help="SentencePiece pieces asked for, per language")
    ap.add_argument("--size", choices=sorted(SIZES), default="base")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--name", default="marian-en-es-random")
    args = ap.parse_args()
    if args.what == "vocab":
        write_vocab(args.dir, args.vocab, args.pieces, args.max_new_tokens, args.name)
    else:
        write_model(args.dir, args.size, args.seed, args.max_new_tokens)
    return 0


if __name__ == "__main__":
    sys.exit(main())
