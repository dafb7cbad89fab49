"""Helpers for the sentence-pairs tests: a synthetic translation task a tiny model learns in seconds, and a short
run of the real trainer on it."""

import random

import chargpt

ALPHABET = "abcdefgh"
CIPHER = dict(zip(ALPHABET, "EFGHABCD"))
# Steps after which each architecture translates the held-out cipher pairs (99-100% exact match on every seed
# tried; the tests ask for 90%).
STEPS = {"decoder": 300, "encoder-decoder": 150}


def cipher(word):
    """The task: a fixed character substitution of the reversed string."""
    return "".join(CIPHER[c] for c in reversed(word))


def cipher_pairs(n, seed=0):
    rng = random.Random(seed)
    words = ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(3, 6))) for _ in range(n)]
    return [(w, cipher(w)) for w in words]


def write_cipher(path, n=2000, seed=0):
    path.write_text("".join(f"{s}\t{t}\n" for s, t in cipher_pairs(n, seed)), encoding="utf-8")
    return path


def train_pairs(data, out_dir, arch="decoder", steps=None, cache_dir=None, **kw):
    """The real trainer on a pairs file with a tiny model (2 layers x 64, context 16): a few seconds on one thread."""
    settings = dict(task="pairs", arch=arch, max_iters=steps or STEPS[arch], eval_interval=100, device="cpu",
                    n_layer=2, n_head=4, n_embd=64, block_size=16, batch_size=32, eval_iters=2, dropout=0.0,
                    threads=1, dtype="float32", learning_rate=3e-3, optimizer="adamw", lr_schedule="cosine",
                    warmup_iters=50, eval_pairs=50, sample_chars=0, log=lambda *a: None)
    return chargpt.train(data=str(data), out_dir=str(out_dir), cache_dir=str(cache_dir) if cache_dir else None,
                         **{**settings, **kw})
