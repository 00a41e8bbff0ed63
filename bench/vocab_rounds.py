"""Issue 29's vocabulary attack as a figure: teach 500 examples of one gloss, recognise, then three rounds of one
more example + recognise; CPU seconds of each (the store's own calls, as the routes make them on worker threads).
``python bench/vocab_rounds.py [--json PATH]``; results in bench/results/vocab_rounds.json."""

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from lingua_fusion.vision import synthetic as syn
from lingua_fusion.vision.store import VocabularyStore

VOCAB = syn.sign_vocabulary(2, seed=3)
rng = np.random.default_rng(1)
seqs = [syn.perform_sign(VOCAB[0], syn.random_performance(rng, mirrored=False), rng) for _ in range(501)]
store = VocabularyStore(Path(tempfile.mkdtemp()), max_examples=600)
vid = store.create("a", "v", "sign").vocab_id
t = time.process_time()
for s in seqs[:500]:
    store.add_example("a", vid, VOCAB[0].gloss, s)
teach = time.process_time() - t
t = time.process_time()
store.recogniser("a", vid).recognise(seqs[500])
first = time.process_time() - t
rounds = []
for i in range(3):
    t = time.process_time()
    store.add_example("a", vid, VOCAB[0].gloss, seqs[i])
    store.recogniser("a", vid).recognise(seqs[500])
    rounds.append(round(time.process_time() - t, 2))
ap = argparse.ArgumentParser()
ap.add_argument("--json", default="bench/results/vocab_rounds.json")
out = {"teach_500_cpu_s": round(teach, 2), "first_recognise_cpu_s": round(first, 2), "change_recognise_cpu_s": rounds}
Path(ap.parse_args().json).write_text(json.dumps(out, indent=1) + "\n")
print(f"teach 500: {teach:.1f} s CPU; first recognise {first:.2f} s; change+recognise rounds {rounds} s CPU")
