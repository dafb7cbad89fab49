"""What a run learns: plain text (a language model) or sentence pairs (a translator). The one place that knows
the difference, so the trainer asks its task instead of testing `cfg.task` at every turn.

    task = make_task(cfg)                      # Text() or Pairs()
    corpus = task.encode(cfg, block_size, log) # cached ids on disk, memory-mapped
    batches = task.batches(corpus, cfg, mcfg, device, log)

Text trains on random windows of the corpus; Pairs on whole pairs (padded, loss on the target only), scores
greedy translations of fixed validation pairs at each evaluation and shows a few when training ends.
"""

import dataclasses

import numpy as np

from chargpt.config.flags import param
from chargpt.data import fim, labels
from chargpt.data.corpus import (
    Batches,
    check_blocks_length,
    encode_corpus,
    split_of,
    split_sizes,
    unseen_in_training,
    val_snippet,
)
from chargpt.data.items import items_layout
from chargpt.data.pairs import PairBatches, encode_pairs
from chargpt.data.tokenizer import Vocab
from chargpt.errors import DataError
from chargpt.sampling.translate import CHRF_MISSING, chrf, exact_match, translate
from chargpt.training.samples import SAMPLE_TEMPERATURE, sample_text

SHOWN_PAIRS = 5  # validation pairs translated when a pairs run ends


def make_task(cfg):
    labels.check_settings(cfg)
    fim.check_settings(cfg)
    return Pairs() if cfg.task == "pairs" else Text()


class Text:
    name = "text"
    # a list (--items: chargpt.data.items), several labelled texts (--labels: chargpt.data.labels)
    items = labels = None
    labels_from = None  # the metadata of the run this one continues or starts from: its labels keep their ids
    fim = None  # fill in the middle (--fim: chargpt.data.fim): the run's markers, and what choosing them said
    fim_note = ""

    def encode(self, cfg, block_size, log):
        if cfg.labels:
            return self._with_fim(self._encode_labelled(cfg, log), cfg)
        fits = split_sizes if cfg.val_split == "tail" else check_blocks_length  # checked before anything is cached
        return self._with_fim(encode_corpus(cfg.data, cfg.encoding, cfg.encoding_errors, cfg.cache_dir, log=log,
                                            check_length=None if cfg.items else
                                            lambda n: fits(n, cfg.val_fraction, block_size)), cfg)

    def _with_fim(self, corpus, cfg):
        """The corpus with the FIM markers added to its vocabulary: a run with --fim, or one that continues or
        starts from a FIM run (its markers stay, and keep their characters)."""
        previous = fim.FimMarkers.from_meta(self.labels_from)
        if previous is None and not cfg.fim:
            return corpus
        base = self.labels_from["vocab"].chars if self.labels_from else []
        self.fim, self.fim_note = fim.FimMarkers.choose([*corpus.vocab.chars, *base], previous)
        clash = next((c for c in self.fim.chars() if c in corpus.vocab.stoi), None)
        if clash is not None:
            raise DataError(f"{cfg.data} holds U+{ord(clash):04X}, which the run it starts from marks fill in the "
                            f"middle with; remove it from the text")
        vocab = Vocab(corpus.vocab.chars + self.fim.chars())
        if vocab.id_dtype != corpus.vocab.id_dtype:
            raise DataError(f"{len(corpus.vocab):,} characters and the 4 fill-in-the-middle markers do not fit in "
                            f"65,535 ids; drop {param('fim')}")
        return dataclasses.replace(corpus, vocab=vocab)

    def _encode_labelled(self, cfg, log):
        """The labelled texts, grouped by label, as one corpus, and the labels' characters added to its
        vocabulary (a label a previous run had keeps its character)."""
        name, sources, names = labels.label_sources(cfg.data, cfg.labels, cfg.encoding)
        corpus = encode_corpus(cfg.data, cfg.encoding, cfg.encoding_errors, cfg.cache_dir, log=log,
                               sources=(name, sources))
        labels.check_no_label_chars(corpus.vocab, cfg.data)
        self.spans, length = labels.label_spans(sources, names, cfg.encoding, cfg.encoding_errors)
        if length != corpus.length:
            raise DataError(f"{cfg.data} changed while it was being read; run again once it is complete")
        self.labels = labels.LabelSet.assign(sorted(set(names)), labels.LabelSet.from_meta(self.labels_from))
        vocab = Vocab(corpus.vocab.chars + self.labels.chars())
        if vocab.id_dtype != corpus.vocab.id_dtype:
            raise DataError(f"{len(corpus.vocab):,} characters and {len(self.labels.names):,} labels do not fit in "
                            f"65,535 ids; use fewer labels")
        return dataclasses.replace(corpus, vocab=vocab)

    def batches(self, corpus, cfg, mcfg, device, log):
        """Random windows of the text, each inside its side of the split (--val-split); self.chars_per_example:
        characters an example trains on; self.closing_prompt: what the closing sample starts from (--sample-prompt,
        else the start of a validation line)."""
        self.chars_per_example = mcfg.block_size
        ids = self.ids = corpus.ids()
        if cfg.labels:
            vocab = corpus.vocab
            batches = labels.LabelBatches(ids, self.spans, {n: vocab.stoi[self.labels.names[n]] for n in self.spans},
                                          vocab.stoi[self.labels.null], cfg, mcfg.block_size, vocab.stoi.get("\n"),
                                          device)
            self.split, self.closing_prompt, self.eval_iters = batches.split, cfg.sample_prompt or "", cfg.eval_iters
            self.label_batches = batches
            return self._fim_batches(batches, corpus, cfg, mcfg)
        if cfg.items:
            self.items = items_layout(ids, corpus.vocab, cfg.val_fraction, mcfg.block_size)
            self.split, self.closing_prompt = self.items.corpus_split, cfg.sample_prompt or ""  # where they are
            return self._fim_batches(Batches(self.items.ids, cfg.val_fraction, mcfg.block_size, cfg.batch_size,
                                             device, self.items.split), corpus, cfg, mcfg)
        self.split = split_of(ids, corpus.vocab, cfg.val_fraction, mcfg.block_size, cfg.val_split)
        self.closing_prompt = cfg.sample_prompt or val_snippet(ids, self.split, corpus.vocab)
        return self._fim_batches(Batches(ids, cfg.val_fraction, mcfg.block_size, cfg.batch_size, device, self.split),
                                 corpus, cfg, mcfg)

    def _fim_batches(self, batches, corpus, cfg, mcfg):
        """--fim: that share of the training windows laid out for fill in the middle (a label stays first)."""
        if not cfg.fim:
            return batches
        fim.check_room(mcfg.block_size)
        return fim.FimBatches(batches, cfg.fim, [corpus.vocab.stoi[c] for c in self.fim.chars()],
                              keep=1 if cfg.labels else 0)

    def describe_split(self, corpus, cfg, known=()):
        """Start-up lines: which text validates, and a warning when it holds characters training never shows (and,
        for a run started from another, its base never learned: `known`)."""
        vocab = corpus.vocab
        lines = self.items.describe(self.chars_per_example) if self.items else [self.split.describe(corpus.length)]
        if self.labels is not None:
            lines.insert(0, labels.describe(self.spans, cfg))
        if cfg.fim:
            lines.append(fim.describe(cfg.fim))
        if self.fim_note:
            lines.append(self.fim_note)
        unseen = [vocab.chars[int(i)] for i in unseen_in_training(self.ids, self.split, len(vocab))]
        unseen = [c for c in unseen if c not in known]
        if unseen:
            shown = " ".join(repr(c) for c in unseen[:12]) + (f" and {len(unseen) - 12} more" if len(unseen) > 12
                                                              else "")
            lines.append(f"warning: the validation text holds {len(unseen)} character(s) the training text lacks "
                         f"({shown}): the model cannot learn them, and the validation loss counts them; "
                         + ("--val-split blocks spreads validation through the corpus" if self.split.how == "tail"
                            else f"a larger corpus or a smaller {param('val_fraction')} makes this rarer"))
        return lines

    def describe_corpus(self, corpus):
        return f"{corpus.length:,} characters"

    def describe_examples(self, mcfg):
        return f"sequences of {mcfg.block_size} chars"

    def scores(self, model, corpus, dtype, log, check_stop=None):
        """A labelled run: the validation loss of each label ({} for other text runs); check_stop() is called before
        each batch (it raises to abandon the evaluation: 10,000 labels are minutes of it)."""
        if self.labels is None:
            return {}
        iters = max(1, self.eval_iters // len(self.spans))
        return {"val_loss_by_label": labels.label_losses(model, self.label_batches, iters, dtype,
                                                         check_stop=check_stop)}

    def closing_sample(self, model, corpus, cfg, dtype, device, out_dir):
        """A sample of text as the run ends (a pairs run shows translations instead), from a short real snippet of
        the validation text unless --sample-prompt says otherwise: the model at its best, not a lone newline."""
        prompt = self.closing_prompt
        start = self.labels.null if self.labels is not None else ""  # a labelled run: unlabelled, as it trained
        text = sample_text(model, corpus.vocab, device, start + prompt, cfg.sample_chars, cfg.seed)
        what = "" if cfg.sample_prompt or not prompt else f", prompted with the start of a validation line, {prompt!r}"
        return (f"\n--- sample from {out_dir} ({cfg.sample_chars} characters, temperature {SAMPLE_TEMPERATURE}"
                f"{what}) ---\n{prompt}{text}\n---")


class Pairs:
    name = "pairs"

    def __init__(self):
        self.chrf_missing_said = False

    def encode(self, cfg, block_size, log):
        return encode_pairs(cfg.data, cfg.target_data, cfg.encoding, cfg.encoding_errors, cfg.cache_dir, log=log)

    def batches(self, corpus, cfg, mcfg, device, log):
        """Random whole pairs; self.chars_per_example is their mean length (the positions run), and eval_rows the
        fixed validation pairs translated at each evaluation."""
        batches = PairBatches(corpus, cfg.val_fraction, mcfg.block_size, cfg.batch_size, device, mcfg.arch, log=log)
        train = batches.index[batches.splits["train"]]  # (pairs, 3): start, source, target lengths
        self.chars_per_example = float(train[:, 1:].sum(axis=1).mean()) + 1  # + SEP
        self.eval_rows = fixed_sample(batches.splits["val"], cfg.eval_pairs)
        self.val_rows = batches.splits["val"]
        return batches

    def describe_corpus(self, corpus):
        return f"{corpus.n_pairs:,} sentence pairs, {corpus.length:,} characters"

    def describe_split(self, corpus, cfg, known=()):
        return []  # pairs: a shuffled split of whole pairs (chargpt.data.pairs)

    def describe_examples(self, mcfg):
        return f"pairs (of at most {mcfg.block_size} chars a side, {self.chars_per_example:.0f} on average)"

    def scores(self, model, corpus, dtype, log, check_stop=None):
        """{exact_match, chrf} of greedy translations of the fixed validation pairs. chrF needs sacrebleu:
        without it, the first evaluation says how to get it, and only exact match is kept. check_stop() is called
        at every decoding step (it raises to abandon the scoring)."""
        if not len(self.eval_rows):
            return {}
        match, score = translation_scores(model, corpus, self.eval_rows, dtype, check_stop)
        if score is None and not self.chrf_missing_said:
            log(CHRF_MISSING)
            self.chrf_missing_said = True
        return {"exact_match": round(match, 6), **({"chrf": round(score, 4)} if score is not None else {})}

    def closing_sample(self, model, corpus, cfg, dtype, device, out_dir):
        """A few greedy translations of validation pairs, with the reference where they differ."""
        rows = self.val_rows[:SHOWN_PAIRS]
        sources, refs = zip(*(corpus.pair(int(i)) for i in rows))
        hyps = translate(model, corpus.vocab, list(sources), dtype=dtype)
        lines = [f"{src}\n  -> {hyp}" + ("" if hyp == ref else f"   (reference: {ref})")
                 for src, hyp, ref in zip(sources, hyps, refs)]
        return (f"\n--- greedy translations of {len(rows)} validation pairs by {out_dir} ---\n"
                + "\n".join(lines) + "\n---")


def translation_scores(model, pairs, rows, dtype, check_stop=None):
    """Greedy translations of the validation pairs `rows` -> (exact-match rate, chrF or None without sacrebleu)."""
    sources, refs = zip(*(pairs.pair(int(i)) for i in rows))
    hyps = translate(model, pairs.vocab, list(sources), dtype=dtype, check_stop=check_stop)
    return exact_match(hyps, refs), chrf(hyps, refs)


def fixed_sample(rows, n):
    """At most n of the validation rows, the same ones at every evaluation of every run on that data."""
    if n >= len(rows):
        return rows
    return np.sort(np.random.default_rng(0).choice(rows, size=n, replace=False))
