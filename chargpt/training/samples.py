"""Samples a run writes: now and then while it trains (the model learning, in its own words), and when it ends.

Decoding has its own random generator and no dropout, and seeds it with the run's seed every time: successive
samples differ only by what the model learned, and training's random streams are untouched.
"""

import time

from chargpt.data.labels import NULL
from chargpt.errors import ChargptError

SAMPLE_TEMPERATURE = 0.8  # engine.Generator's default: what the closing sample's header says


def sample_text(model, vocab, device, prompt, chars, seed):
    """A sample of `model` as it is now, `chars` characters after `prompt` -> the text after the prompt. The model
    is back in training mode afterwards."""
    from chargpt.sampling.engine import Generator  # the sampling engine: imported when a run first samples
    gen = Generator(model, vocab, device)  # puts the model in eval mode
    try:
        return gen.generate(prompt, max_new_tokens=chars, seed=seed)[0]
    finally:
        model.train()


class NoveltyScorer:
    """How much of a sample is copied from the training text (a chargpt.tools.novelty Report), so that samples.jsonl and
    the log show memorisation grow. The index is built at the first sample (once per corpus, then cached); if it
    cannot be built, samples are recorded without a score: a score is not worth stopping a training for."""

    def __init__(self, corpus, val_fraction, split, log):
        self.corpus, self.val_fraction, self.split, self.log = corpus, val_fraction, split, log
        self.index = None  # built on first use; False once it failed

    def score(self, text):
        from chargpt.tools import novelty  # its index is built only by runs that sample
        if self.index is False:
            return None
        try:
            if self.index is None:
                self.index = novelty.index_corpus(self.corpus, self.val_fraction, log=self.log, split=self.split)
            return self.index.score(text)
        except (ChargptError, OSError, MemoryError) as e:
            self.log(f"warning: no novelty score for the samples ({e}); they are recorded without one")
            self.index = False
            return None


class Samples:
    """Every --sample-every steps (rank 0): a short sample from --sample-prompt (else a newline) above the progress
    bar, and a "sample" record for the sinks (samples.jsonl: after the state it follows, so that a resumed run
    drops lines past its step, as for metrics.jsonl)."""

    def __init__(self, model, vocab, device, prompt, chars, seed, novelty: NoveltyScorer, sinks, log):
        self.model, self.vocab, self.device = model, vocab, device
        self.prompt, self.chars, self.seed = prompt or "", chars, seed
        self.novelty, self.sinks, self.log = novelty, sinks, log

    def write(self, step):
        """The sample at `step` -> seconds it took (left out of the training speed)."""
        t0 = time.perf_counter()
        start = NULL if NULL in self.vocab.stoi else ""  # a --labels run: "no label" first, as its unlabelled windows
        text = sample_text(self.model, self.vocab, self.device, start + self.prompt, self.chars, self.seed)
        report = self.novelty.score(text)
        self.sinks.write("sample", {"step": step, "prompt": self.prompt, "text": text,
                                    **({"novelty": report.summary()} if report else {})})
        self.log(f"--- sample at step {step} ---\n{self.prompt}{text}\n---" + (f"\n{report.line()}" if report else ""))
        return time.perf_counter() - t0
