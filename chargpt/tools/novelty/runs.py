"""A run's own corpus: the text a checkpoint trained on, found by the corpus cache key it recorded, else encoded
again from the path it trained on (or from --data, checked to be the same corpus by its hash), and the Novelty
index over that run's own split of it."""

from pathlib import Path

from chargpt.errors import DataError
from chargpt.runs.checkpoint import run_settings
from chargpt.tools.novelty.index import index_corpus


class CorpusMissing(DataError):
    """The text a run trained on is not to be found (or what is found is another text). The message is the
    command line's (it names the paths and --data); `web` says the same for the playground, without them."""

    def __init__(self, message, web):
        super().__init__(message)
        self.web = web


def run_corpus(meta, data=None, cache_dir=None, run="the run", log=print, encode=True):
    """A checkpoint's metadata -> its encoded corpus (chargpt.data.corpus.EncodedCorpus or EncodedPairs), found by the
    corpus cache key the run recorded, else re-encoded from the path it trained on; `data` replaces that path
    (a corpus moved elsewhere), checked to be the same corpus by its hash. encode=False: only one in the cache,
    else CorpusMissing (nothing is read from the path or written)."""
    from chargpt.data import corpus as corpus_data
    from chargpt.data import pairs as corpus_pairs
    tc = run_settings(meta, assumed=True)
    task, encoding, errors = tc.task, tc.encoding, tc.encoding_errors
    cache = Path(cache_dir or tc.cache_dir or corpus_data.default_cache_dir()).expanduser()
    recorded = meta.get("corpus_key")
    path = data if data is not None else tc.data
    if data is None and recorded:
        name = meta.get("corpus") or "corpus"
        corpus = (corpus_pairs.cached_pairs if task == "pairs" else corpus_data.cached_corpus)(cache, recorded, name)
        if corpus is not None:
            return _same_vocab(corpus, meta, run)
    if not encode:
        raise CorpusMissing(f"the training text of {run} is not in the cache {cache}", "is not cached")
    if data is None and path is not None and not Path(path).expanduser().exists():
        raise CorpusMissing(f"the training text of {run} is gone ({path} does not exist and its encoding is not in "
                            f"the cache {cache}); pass --data FILE with the same corpus (checked by its hash)",
                            "is not on this server (the file it trained on was moved or deleted, and so was its "
                            "cached copy)")
    if task == "pairs":
        _, key, _ = corpus_pairs.pair_stream(path, tc.target_data, encoding, errors)
    else:
        key = corpus_data.corpus_key(corpus_data.corpus_sources(path, encoding)[1], encoding, errors)
    if recorded and key != recorded:
        where = path if path is not None else "the built-in corpus of this Python"
        raise CorpusMissing(f"{where} is not the corpus {run} was trained on (its hash differs); pass --data FILE "
                            f"with the text it trained on", "is not on this server (the file it trained on has "
                            "changed since, and its cached copy is gone)")
    if task == "pairs":
        corpus = corpus_pairs.encode_pairs(path, tc.target_data, encoding, errors, cache, log=log)
    else:
        corpus = corpus_data.encode_corpus(path, encoding, errors, cache, log=log)
    return _same_vocab(corpus, meta, run)


def _same_vocab(corpus, meta, run):
    """The corpus, if its vocabulary is the run's: the guard for runs saved before they recorded their corpus key.
    A run started from another (--init-from) trains in the base's vocabulary extended by its corpus's characters,
    so there the corpus's characters need only be among the run's (the text is scored in the corpus's own ids); so
    does a run trained with --labels or --fim, whose vocabulary adds its labels (chargpt/data/labels.py) or its markers
    (chargpt/data/fim.py) to the corpus's."""
    from chargpt.training.init_from import read_lineage
    within = (read_lineage(meta) is not None or meta.get("labels") is not None or meta.get("fim") is not None) and \
        all(c in meta["vocab"].stoi for c in corpus.vocab.chars)
    if corpus.vocab != meta["vocab"] and not within:
        raise CorpusMissing(f"the corpus found for {run} has a different vocabulary ({len(corpus.vocab):,} "
                            f"characters against its {len(meta['vocab']):,}): not the text it trained on; pass --data "
                            f"FILE with it", "is not on this server (the text found for it is another one)")
    return corpus


def for_run(checkpoint, data=None, cache_dir=None, log=print):
    """A run directory or checkpoint file -> Novelty over the text it trained on."""
    from chargpt.runs.checkpoint import read_meta
    from chargpt.runs.rundir import resolve
    meta, _ = read_meta(resolve(checkpoint))
    return for_meta(meta, str(checkpoint), data, cache_dir, log)


def for_meta(meta, run="the run", data=None, cache_dir=None, log=print, build=True):
    """A checkpoint's metadata (checkpoint.read_meta, Generator.meta) -> Novelty over the text it trained on.
    build=False: only a corpus and index already cached (CorpusMissing or cache.NotIndexed where they are not);
    nothing is encoded, built or written."""
    return index_run(meta, run_corpus(meta, data, cache_dir, run=run, log=log, encode=build), log, build)


def index_run(meta, corpus, log=print, build=True):
    """Novelty over `corpus` (run_corpus) as the run with metadata `meta` split it (build: as index_corpus's)."""
    tc = run_settings(meta, assumed=True)
    fraction, split = tc.val_fraction, None
    if tc.task == "text":  # the split the run trained with
        from chargpt.data.corpus import split_of
        split = split_of(corpus.ids(), corpus.vocab, fraction, meta["model_config"].block_size, tc.val_split)
    return index_corpus(corpus, fraction, log=log, split=split, build=build)


def corpus_identity(meta):
    """What decides a run's novelty index (its corpus and split), from its metadata: two checkpoints with the same
    identity share one index (the playground reloads an index when a run's checkpoint changes and this does)."""
    tc = run_settings(meta, assumed=True)
    model = meta.get("model_config")
    keys = ("task", "data", "target_data", "encoding", "encoding_errors", "cache_dir", "val_fraction", "val_split")
    return (meta.get("corpus_key"), tuple(str(getattr(tc, k)) for k in keys),
            getattr(model, "block_size", None))
