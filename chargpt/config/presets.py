"""Presets: named starting points for every setting (--preset NAME), over the dataclasses' defaults in
chargpt/config/__init__.py (the GPU's). chargpt.config re-exports every name here."""

UNLIMITED = 10**12  # max_iters when only --max-time bounds a run
AUTO_BUDGET_S = 150.0  # --preset auto's time budget when none is given: `python train.py` ends in about 3 minutes


# --- presets: named starting points for every setting -------------------------------------------------------
# name -> {field: value}, over the dataclass defaults (the GPU's: shakespeare-char is exactly them); flags and
# --config override a preset. Without --preset the device picks one (device_preset): auto, or shakespeare-char on
# CUDA. Each has a one-line description in PRESET_ABOUT; --help and docs/runs.md give their sizes.
# The 2017 Transformer ("Attention Is All You Need", Table 3, base) at character level: 6 + 6 layers x 512, 8 heads,
# feed-forward 2048 (our MLP is 4 x --n-embd: exactly 2048 at 512), dropout 0.1, sinusoidal positions, embeddings x
# sqrt(512), post-LN, ReLU, label smoothing 0.1, Adam beta2 0.98 without weight decay, and the inverse-square-root
# schedule with 4,000 warmup steps, whose peak is the paper's d_model**-0.5 x 4000**-0.5 = 7.0e-4; 100,000 steps, as
# the paper trained base. A context of 256 characters holds most sentences. (Gradient clipping, which the paper does
# not mention, stays on: our product default.)
TRANSFORMER = dict(task="pairs", arch="encoder-decoder", pos_emb="sinusoidal", emb_scale=True, norm="post",
                   activation="relu", dropout=0.1, label_smoothing=0.1, beta2=0.98, weight_decay=0.0,
                   lr_schedule="inverse-sqrt")
# "auto" (chargpt/training/sizing.py) is the cpu preset's optimiser and schedule, a time budget instead of a step
# budget, and the model sized at start from that budget, this machine's measured speed and the corpus; the model
# settings here (the cpu preset's) are what a run keeps when there is nothing to size by (sentence pairs).
_CPU_TRAINING = dict(learning_rate=4e-3, optimizer="muon", muon_lr=0.01, lr_schedule="wsd", eval_interval=250,
                     eval_iters=20)
PRESETS = {
    "auto": dict(n_layer=2, n_head=4, n_embd=128, block_size=128, dropout=0.0, batch_size=16, **_CPU_TRAINING,
                 max_time=AUTO_BUDGET_S, max_iters=UNLIMITED, softmax="auto"),
    "tiny": dict(n_layer=2, n_head=2, n_embd=64, block_size=32, dropout=0.0, batch_size=16, learning_rate=3e-3,
                 max_iters=300, warmup_iters=20, eval_interval=100, eval_iters=10, sample_chars=200),
    # the setting that learned most in a fixed two minutes in searches on 2-core CPUs (benchmarks/RESULTS.md):
    # Muon for the block matrices at 0.01 and AdamW at 4e-3 for the rest, warmup-stable-decay, context 128
    "cpu": dict(n_layer=2, n_head=4, n_embd=128, block_size=128, dropout=0.0, batch_size=16, **_CPU_TRAINING,
                max_iters=3000),
    "shakespeare-char": {},
    # GPT-2 small's shape and optimiser (AdamW at 6e-4 decaying to 6e-5, beta2 0.95, 2000 warmup steps, as in
    # nanoGPT's GPT-2 config) over characters at context 1024. 32 x 1024 characters per step; dropout 0.1 against
    # overfitting a corpus that is small for 85M parameters.
    "gpt2-small-char": dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, dropout=0.1, batch_size=32,
                            learning_rate=6e-4, min_lr=6e-5, beta2=0.95, warmup_iters=2000, max_iters=50000,
                            eval_interval=1000, eval_iters=50),
    "transformer-base": dict(TRANSFORMER, n_layer=6, n_enc_layer=6, n_head=8, n_embd=512, block_size=256,
                             warmup_iters=4000, learning_rate=512**-0.5 * 4000**-0.5, max_iters=100_000),
    # its CPU-sized sibling: the same choices at 2 + 2 layers x 128 (about 1M parameters), the peak again
    # d_model**-0.5 x warmup**-0.5 (4.4e-3); learns a few thousand short pairs in minutes on a laptop
    "transformer-small": dict(TRANSFORMER, n_layer=2, n_enc_layer=2, n_head=4, n_embd=128, block_size=128,
                              batch_size=32, warmup_iters=400, learning_rate=128**-0.5 * 400**-0.5, max_iters=5000,
                              eval_interval=250, eval_iters=20),
}
PRESET_ABOUT = {
    "auto": f"the default without a GPU: the model (2 x 64 up to 6 x 384), context, batch, dropout and steps sized "
            f"at start for the time budget (--max-time, default {AUTO_BUDGET_S:g} s), this machine's measured speed "
            f"and the corpus; the cpu preset's optimiser and schedule",
    "tiny": "tests and demos: 300 steps, seconds on any CPU; writes word-like text, not sense",
    "cpu": "a fixed model, --preset auto's for short budgets: learned most in two minutes in a search on a 2-core "
           "CPU; Muon (0.01) and AdamW (4e-3), warmup-stable-decay; 3000 steps of 16 x 128 characters",
    "shakespeare-char": "the default on a CUDA GPU: nanoGPT's classic shakespeare-char recipe, dropout 0.2; 5000 "
                        "steps of 64 x 256 characters",
    "gpt2-small-char": "GPT-2 small's shape and optimiser (learning rate 6e-4 to 6e-5, beta2 0.95, 2000 warmup "
                       "steps) at context 1024, for a GPU with 40 GB or more and a corpus of 10M+ characters (e.g. "
                       "enwik8); 50000 steps of 32 x 1024 characters, dropout 0.1",
    "transformer-base": "the 2017 paper's base Transformer for sentence pairs (--task pairs): 6+6 layers x 512, "
                        "sinusoidal positions, post-LN, ReLU, label smoothing 0.1, Adam beta2 0.98, "
                        "inverse-square-root warmup of 4000 steps; for a GPU",
    "transformer-small": "its CPU-sized sibling (2+2 layers x 128, 400 warmup steps): learns a few thousand short "
                         "sentence pairs in minutes on a laptop",
}
