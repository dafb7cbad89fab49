"""Is it writing or copying (chargpt/tools/novelty/): the suffix arrays against plain sorting, the scores against brute
force, and what a user reads: a slice of the training text is copied at its true line, random text is not, a
splice shows its two sources, validation text is found in the validation split only, CJK, the cache, a missing
corpus, and the JSON of `chargpt novelty`, `sample.py --novelty` and samples.jsonl."""

import json
import os
import random
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner
from helpers import need, run_chargpt, train_pairs, write_cipher

import chargpt
from chargpt.cli import novelty_cli, sample_cli
from chargpt.data.corpus import encode_corpus, split_of
from chargpt.data.pairs import encode_pairs
from chargpt.tools import novelty

WORDS = ("time love night king lord death heaven blood sweet fair honour grace noble gentle heart hand eyes tongue "
         "sword crown peace war friend brother father mother daughter soul fortune nature virtue reason truth").split()
TINY = dict(device="cpu", n_layer=1, n_head=2, n_embd=16, block_size=16, batch_size=4, eval_iters=2, dropout=0.0,
            threads=1, dtype="float32", curves=False, log=lambda *a: None)


def invoke(cli, *args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def verse(lines=400, seed=0, words=WORDS):
    """Lines of random words: every span of 20+ characters is (almost surely) in one place only."""
    rng = random.Random(seed)
    return "".join(f"{' '.join(rng.choice(words) for _ in range(rng.randint(5, 9)))}.\n" for _ in range(lines))


def at_line(text, line, chars):
    """`chars` characters of text from the start of line `line` (1-based)."""
    start = sum(len(x) + 1 for x in text.split("\n")[:line - 1])
    return text[start:start + chars]


@pytest.fixture
def text_index(tmp_path):
    """(corpus text, Novelty over it): the last 10% validate."""
    text = verse()
    path = tmp_path / "verse.txt"
    path.write_text(text, encoding="utf-8")
    corpus = encode_corpus(str(path), cache_dir=tmp_path / "cache")
    return text, novelty.index_corpus(corpus, 0.1, log=lambda *a: None)


# --- the index and the search, against references -------------------------------------------------------------------
@pytest.mark.parametrize("vocab", [2, 5, 300])  # 300: ids past one byte (pydivsufsort's two-byte path)
def test_suffix_arrays_sort_the_suffixes(vocab):
    rng = np.random.default_rng(vocab)
    for n in (1, 2, 7, 64, 300):
        ids = rng.integers(0, vocab, n).astype(np.uint16)
        expected = sorted(range(n), key=lambda i: ids[i:].tolist())
        assert novelty.suffix_array_numpy(ids).tolist() == expected
        assert novelty.suffix_array(ids).tolist() == expected  # pydivsufsort where installed, else the same
        if novelty.suffixarray.pydivsufsort is not None:
            assert novelty.suffix_array(ids, "pydivsufsort").tolist() == expected


def test_without_pydivsufsort_numpy_builds_the_index(monkeypatch):
    monkeypatch.setattr(novelty.suffixarray, "pydivsufsort", None)
    ids = np.random.default_rng(0).integers(0, 4, 500).astype(np.uint16)
    assert novelty.suffix_array(ids).tolist() == sorted(range(500), key=lambda i: ids[i:].tolist())
    with pytest.raises(chargpt.ChargptError, match=r"pip install -e \"\.\[novelty\]\""):
        novelty.suffix_array(ids, "pydivsufsort")


def test_matching_statistics_against_brute_force():
    rng = np.random.default_rng(1)
    for _ in range(30):
        ids = rng.integers(0, 3, int(rng.integers(1, 80))).astype(np.uint16)
        query = rng.integers(-1, 3, int(rng.integers(1, 40)))  # -1: a character the corpus lacks
        starting, where = novelty.matching_statistics(ids, novelty.suffix_array(ids), query, block=3)
        for i in range(len(query)):
            best = max(_common(query[i:], ids[j:]) for j in range(len(ids)))
            assert starting[i] == best
            assert ids[where[i]:where[i] + best].tolist() == query[i:i + best].tolist()
        ends = np.arange(len(query)) + starting
        for j, got in enumerate(novelty.spans_ending(ends)):
            assert got == max([j - i + 1 for i in range(j + 1) if starting[i] >= j - i + 1], default=0)


def test_long_copied_stretches_are_followed_past_the_search_cap():
    """A text copied at length L is searched to SEARCH_CAP characters a position, then followed once: the same
    lengths and sources as an uncapped search, and a whole copied corpus scores in linear time."""
    rng = np.random.default_rng(2)
    ids = rng.integers(0, 16, 3000).astype(np.uint16)  # random: long matches are unique
    query = np.concatenate([ids[100:1100], rng.integers(0, 16, 50), ids[2000:2600], [-1], ids[5:40]])
    sa = novelty.suffix_array(ids)
    exact = novelty.matching_statistics(ids, sa, query, block=3, cap=10**9)
    capped = novelty.matching_statistics(ids, sa, query, block=3, cap=8)
    assert exact[0].tolist() == capped[0].tolist() and exact[0][0] >= 1000
    for i in (0, 500, 1050, 1600):
        n = int(capped[0][i])
        assert ids[capped[1][i]:capped[1][i] + n].tolist() == query[i:i + n].tolist()
    big = rng.integers(0, 60, 100_000).astype(np.uint16)
    starting, _ = novelty.matching_statistics(big, novelty.suffix_array(big), big.astype(np.int64))  # not hours
    assert starting[0] == len(big) and starting[-1] == 1 and (np.diff(starting) == -1).all()


def test_matching_statistics_stop_where_a_stretch_ends_against_brute_force():
    """A split of several stretches (--val-split blocks): a match never runs on past the end of its stretch."""
    rng = np.random.default_rng(3)
    for _ in range(40):
        n = int(rng.integers(2, 80))
        ids = rng.integers(0, 3, n).astype(np.uint16)
        bounds = [0, *sorted(set(rng.integers(1, n, 4).tolist())), n]
        segs = np.array([(bounds[i], bounds[i + 1]) for i in range(0, len(bounds) - 1, 2)])
        sa = novelty.stretch_suffix_array(ids, segs)
        assert sorted(sa.tolist()) == [p for a, b in segs for p in range(a, b)]
        query = rng.integers(-1, 3, int(rng.integers(1, 40)))
        starting, where = novelty.matching_statistics(ids, sa, query, block=3, stretches=(segs[:, 0], segs[:, 1]))
        for i in range(len(query)):
            best = max(_common(query[i:], ids[p:b]) for a, b in segs for p in range(a, b))
            assert starting[i] == best
            if best:
                assert any(a <= where[i] and where[i] + best <= b for a, b in segs)
                assert ids[where[i]:where[i] + best].tolist() == query[i:i + best].tolist()
    ids = rng.integers(0, 16, 3000).astype(np.uint16)  # past the search cap too: followed up to the stretch's end
    segs = np.array([[0, 1000], [1500, 3000]])
    sa = novelty.stretch_suffix_array(ids, segs)
    query = ids[800:1200].astype(np.int64)  # runs on past 1000 in the corpus, but 1000-1500 is not in the split
    for cap in (8, 10**9):
        starting, where = novelty.matching_statistics(ids, sa, query, block=3, cap=cap, stretches=tuple(segs.T))
        assert starting[:180].tolist() == list(range(200, 20, -1)) and where[0] == 800


def test_absent_characters_and_followed_copies_cost_no_search(monkeypatch):
    """A character the corpus lacks matches nothing without a binary search, and so does every position inside a
    copied stretch already followed past the search cap (in a later group of positions): a long input of either
    costs its length, not a search per character; the scores are those of searching every position."""
    rng = np.random.default_rng(4)
    ids = rng.integers(0, 16, 3000).astype(np.uint16)
    sa = novelty.suffix_array(ids)
    query = np.concatenate([np.full(5000, novelty.NO_MATCH), ids[:50], np.full(5000, novelty.NO_MATCH), ids[100:2900],
                            rng.integers(0, 16, 300)])
    full = novelty.matching_statistics(ids, sa, query, cap=64)
    searched = []
    search = novelty.score._search
    monkeypatch.setattr(novelty.score, "_search", lambda text, sa, q, rows, *a: searched.append(len(rows)) or
                        search(text, sa, q, rows, *a))
    monkeypatch.setattr(novelty.score, "ROWS", 100)
    grouped = novelty.matching_statistics(ids, sa, query, cap=64)
    assert grouped[0].tolist() == full[0].tolist() and grouped[1].tolist() == full[1].tolist()
    assert full[0][10_050] == 2800  # the copied stretch, followed from its first position
    assert sum(searched) < 50 + 2 * 100 + 300 + 100  # not the 10,000 absent ones, not the 2,800 copied ones


def test_the_text_scored_at_once_is_capped_and_the_cap_is_said(tmp_path):
    """chargpt novelty reads at most MAX_INPUT_BYTES (1 MiB: about half a minute of scoring at worst on a 2-core
    CPU; 16 MiB took minutes), from an argument, a file or stdin, and the error names the cap."""
    assert novelty.MAX_INPUT_BYTES <= 1 << 20
    big = tmp_path / "big.txt"
    big.write_bytes(b"a" * (novelty.MAX_INPUT_BYTES + 1))
    for text, path in (("a" * (novelty.MAX_INPUT_BYTES + 1), None), ("\u00e9" * (novelty.MAX_INPUT_BYTES // 2 + 1),
                                                                        None), (None, big)):
        with pytest.raises(chargpt.ChargptError, match=r"larger than 1 MiB, the most chargpt novelty scores at once"):
            novelty.read_input(text, path)
    big.write_bytes(b"a" * novelty.MAX_INPUT_BYTES)
    assert len(novelty.read_input(None, big)) == novelty.MAX_INPUT_BYTES


def _common(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


# --- scores a user reads ------------------------------------------------------------------------------------------
def test_a_slice_of_the_training_text_is_copied_at_its_true_line(text_index):
    text, index = text_index
    report = index.score(at_line(text, 57, 150))
    assert report.train.copied_fraction == 1.0 and report.train.longest.length == 150
    assert report.summary()["longest_line"] == 57 and len(report.train.spans) == 1
    assert report.train.longest.excerpt == at_line(text, 57, novelty.EXCERPT_CHARS) + "…"
    assert report.train.longest.context == ""
    assert report.train.starting.tolist() == list(range(150, 0, -1))
    assert report.train.ending.tolist() == list(range(1, 151))
    assert novelty.format_summary(report) == "copied: 100% in spans of 20+; longest 150 chars, from line 57"
    mid_line = index.score(at_line(text, 57, 150)[12:]).train.longest  # its context: the line before the span
    assert mid_line.line == 57 and mid_line.context == at_line(text, 57, 12)


def test_random_characters_score_about_zero(text_index):
    _, index = text_index
    rng = random.Random(5)
    report = index.score("".join(rng.choice(index.vocab.chars) for _ in range(1000)))
    assert report.train.copied_fraction == 0 and report.train.longest.length < 8 and not report.train.spans
    nothing = index.score("\u00a7" * 30)  # no character of it is in the corpus
    assert nothing.train.longest is None and nothing.summary()["longest_line"] is None
    assert novelty.format_summary(nothing) == "copied: 0% in spans of 20+; longest 0 chars"
    assert index.score("").summary()["copied_fraction"] == 0


def test_a_splice_of_two_slices_shows_two_spans_with_their_lines(text_index):
    text, index = text_index
    report = index.score(at_line(text, 30, 80) + at_line(text, 300, 90))
    spans = report.train.spans
    assert [s.line for s in spans] == [30, 300]
    assert spans[0].start == 0 and spans[1].end == 170 and report.train.copied_fraction == 1.0
    assert report.summary()["longest"] >= 90 and report.summary()["longest_line"] == 300


def test_validation_text_is_copied_from_the_validation_split_not_training(text_index):
    text, index = text_index
    line = text[:int(len(text) * 0.9)].count("\n") + 10  # well inside the last 10%
    report = index.score(at_line(text, line, 120))
    assert report.train.copied_fraction == 0 and report.val.copied_fraction == 1.0
    assert report.val.longest.line == line  # counted in the whole file, as an editor shows it
    assert report.summary()["val_copied_fraction"] == 1.0 and "from the validation text: 100%" in \
        novelty.format_summary(report)


def test_min_span_decides_what_counts_as_copied(text_index):
    text, index = text_index
    piece = at_line(text, 12, 30) + "\u00a7" + at_line(text, 40, 12)  # a character the corpus lacks between them
    assert index.score(piece, min_span=20).train.copied_fraction == pytest.approx(30 / 43)
    assert index.score(piece, min_span=10).train.copied_fraction == pytest.approx(42 / 43)
    with pytest.raises(chargpt.ChargptError, match="--min-span"):
        index.score(piece, min_span=0)


def test_cjk_text_is_indexed_by_characters(tmp_path):
    chars = [chr(c) for c in range(0x4E00, 0x4E00 + 400)]  # 400 distinct: ids take two bytes
    text = verse(lines=300, seed=3, words=["".join(random.Random(i).choices(chars, k=4)) for i in range(150)])
    path = tmp_path / "tang.txt"
    path.write_text(text, encoding="utf-8")
    index = novelty.index_corpus(encode_corpus(str(path), cache_dir=tmp_path / "c"), 0.1, log=lambda *a: None)
    assert len(index.vocab) > 256
    report = index.score("한" + at_line(text, 101, 40))  # a character the corpus does not have
    assert report.train.copied_fraction == pytest.approx(40 / 41) and report.train.longest.line == 101
    assert report.train.longest.excerpt == at_line(text, 101, 40)


def test_the_default_min_span_follows_the_alphabet(tmp_path, text_index):
    """20 for alphabetic scripts; 10 from 1,000 distinct characters (Chinese: a character is about a word, so a
    recited 12-character Tang couplet is copied, not new), when no min_span is given (docs/novelty.md)."""
    assert novelty.default_min_span(65) == novelty.default_min_span(999) == 20
    assert novelty.default_min_span(1000) == novelty.default_min_span(9728) == 10
    _, small = text_index
    assert small.default_min_span == 20 and small.score("abc").min_span == 20
    chars = [chr(c) for c in range(0x4E00, 0x4E00 + 1200)]
    rng = random.Random(5)
    text = "".join("".join(rng.choices(chars, k=5)) + "，" + "".join(rng.choices(chars, k=5)) + "。\n"
                   for _ in range(800))
    path = tmp_path / "tang.txt"
    path.write_text(text, encoding="utf-8")
    index = novelty.index_corpus(encode_corpus(str(path), cache_dir=tmp_path / "c"), 0.1, log=lambda *a: None)
    assert len(index.vocab) >= 1000 and index.default_min_span == 10
    couplet = text.splitlines()[3]  # 12 characters: copied at 10, new at 20
    report = index.score(couplet)
    assert report.min_span == 10 and report.train.copied_fraction == 1.0
    assert index.score(couplet, min_span=20).train.copied_fraction == 0.0


def test_the_index_is_built_once_cached_and_memory_mapped(text_index, tmp_path, monkeypatch):
    text, _ = text_index
    corpus = encode_corpus(str(tmp_path / "verse.txt"), cache_dir=tmp_path / "cache")
    monkeypatch.setattr(novelty.index, "suffix_array", lambda ids: pytest.fail("the cached index was rebuilt"))
    index = novelty.index_corpus(corpus, 0.1, log=lambda *a: None)
    assert all(isinstance(s.sa, np.memmap) for s in index.splits.values())
    assert index.score(at_line(text, 3, 40)).train.copied_fraction == 1.0
    assert not list((tmp_path / "cache").glob(".*tmp*"))  # written atomically: no temporary file left
    # a damaged index (a position past the text) is rebuilt, not trusted
    monkeypatch.undo()
    path = next((tmp_path / "cache").glob("*.sa-train-*.npy"))
    damaged = np.load(path).copy()
    damaged[5] = len(damaged) + 7
    np.save(path, damaged)
    index = novelty.index_corpus(corpus, 0.1, log=lambda *a: None)
    assert index.score(at_line(text, 3, 40)).train.copied_fraction == 1.0


def test_a_shuffled_suffix_array_is_noticed_and_rebuilt(text_index, tmp_path):
    """Damage that stays in range (every position of the text, once, out of order) is found by the order check
    when the index loads: said in one line, rebuilt, and the score is right."""
    text, _ = text_index
    corpus = encode_corpus(str(tmp_path / "verse.txt"), cache_dir=tmp_path / "cache")
    path = next((tmp_path / "cache").glob("*.sa-train-*.npy"))
    shuffled = np.load(path)
    np.random.default_rng(0).shuffle(shuffled)
    np.save(path, shuffled)
    said = []
    index = novelty.index_corpus(corpus, 0.1, log=said.append)
    assert index.score(at_line(text, 3, 40)).train.copied_fraction == 1.0
    assert said[0] == f"the cached novelty train index {path} is damaged (its suffixes out of order); rebuilding it"
    assert len(said) == 2 and said[1].startswith("indexing the")
    said.clear()
    novelty.index_corpus(corpus, 0.1, log=said.append)
    assert said == []  # the rebuilt one is sound


def test_a_swollen_lines_file_is_not_read_and_is_rebuilt(text_index, tmp_path, monkeypatch):
    """A line-end list far longer than the corpus has lines (sparse, every entry 0: in range) is refused by its
    size on disk, before any of it is read; the line numbers stay right."""
    text, _ = text_index
    corpus = encode_corpus(str(tmp_path / "verse.txt"), cache_dir=tmp_path / "cache")
    path = next((tmp_path / "cache").glob("*.lines.v1.npy"))
    swollen = np.lib.format.open_memmap(path, mode="w+", dtype=np.int32, shape=(1_000_000,))  # 4 MB of zeros
    del swollen
    load = np.load

    def small_only(file, *a, **kw):
        assert os.path.getsize(file) < 100_000, "a file far past what the corpus implies was read"
        return load(file, *a, **kw)
    monkeypatch.setattr(np, "load", small_only)
    said = []
    index = novelty.index_corpus(corpus, 0.1, log=said.append)
    assert index.score(at_line(text, 30, 40)).train.longest.line == 30
    assert said == [f"the cached novelty line ends {path} is damaged (4,000,128 bytes for 400 entries); rebuilding it"]
    np.save(path, np.load(path)[:-1])  # one line end short: the corpus says how many there are
    said.clear()
    novelty.index_corpus(corpus, 0.1, log=said.append)
    assert said == [f"the cached novelty line ends {path} is damaged (399 entries where the corpus has 400); "
                    f"rebuilding it"]


def test_index_temp_files_of_dead_processes_are_removed(text_index, tmp_path):
    """A write cut short by kill -9 leaves `.<key>.sa-...npy.tmp<pid>`: the next indexing of that corpus removes
    those of processes that are gone, and leaves a running one's alone."""
    corpus = encode_corpus(str(tmp_path / "verse.txt"), cache_dir=tmp_path / "cache")
    gone = subprocess.Popen([sys.executable, "-c", ""])
    gone.wait()
    stale = tmp_path / "cache" / f".{corpus.key}.sa-train-1.v1.npy.tmp{gone.pid}"
    stale_lines = tmp_path / "cache" / f".{corpus.key}.lines.v1.npy.tmp{gone.pid}"
    running = tmp_path / "cache" / f".{corpus.key}.sa-val-1.v1.npy.tmp{os.getppid()}"
    for f in (stale, stale_lines, running):
        f.write_bytes(b"\0" * 1000)
    novelty.index_corpus(corpus, 0.1, log=lambda *a: None)
    assert not stale.exists() and not stale_lines.exists() and running.exists()


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="POSIX signals")
def test_sigterm_while_an_index_is_written_leaves_no_partial_file(tmp_path):
    """SIGTERM (what kill and job schedulers send) in the middle of writing an index file stops the command as
    Ctrl-C does: the hidden partial file is removed."""
    corpus = tmp_path / "verse.txt"
    corpus.write_text(verse(), encoding="utf-8")
    encode_corpus(str(corpus), cache_dir=tmp_path / "cache")
    script = ("import sys, time\nimport numpy as np\nfrom chargpt.data.corpus import encode_corpus\n"
              "from chargpt.tools import novelty\n"
              "def slow(f, arr, allow_pickle=False):\n"
              "    f.write(b'part of an index')\n    f.flush()\n    print('writing', flush=True)\n    time.sleep(60)\n"
              "np.save = slow\n"
              "novelty.index_corpus(encode_corpus(sys.argv[1], cache_dir=sys.argv[2]), 0.1, log=lambda m: None)\n")
    proc = subprocess.Popen([sys.executable, "-c", script, str(corpus), str(tmp_path / "cache")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "writing\n", proc.stderr.read()
        assert list((tmp_path / "cache").glob(".*.npy.tmp*"))  # the partial file is there
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    finally:
        proc.kill()
        proc.communicate()
    assert proc.returncode != 0 and not list((tmp_path / "cache").glob(".*tmp*"))


def test_blocks_split_spans_stop_where_a_training_stretch_ends(tmp_path):
    """Under --val-split blocks, a match that starts in a training stretch stops where it ends: the validation
    stretch after it is not counted as copied from training (it is from the validation text), and no span is
    longer than a training stretch."""
    text = verse()
    path = tmp_path / "verse.txt"
    path.write_text(text, encoding="utf-8")
    corpus = encode_corpus(str(path), cache_dir=tmp_path / "cache")
    split = split_of(corpus.ids(), corpus.vocab, 0.1, 16, "blocks")
    index = novelty.index_corpus(corpus, 0.1, log=lambda *a: None, split=split)
    a, b = (int(x) for x in split.val[0])  # the first validation stretch, with training text before it
    report = index.score(text[a - 30:b])
    assert report.train.starting[0] == 30 and report.train.longest.length == 30  # not b - a + 30
    assert report.train.copied_fraction < 0.5  # the 30, and a chance phrase or two of the validation text
    assert report.val.longest.length == b - a and report.val.longest.start == 30
    whole = index.score(text).train
    assert whole.longest.length == max(int(y - x) for x, y in split.train)
    assert all(any(x <= s.offset and s.offset + s.length <= y for x, y in split.train) for s in whole.spans)


def test_sentence_pairs_are_scored_per_split_and_located_by_pair(tmp_path):
    rng = random.Random(2)
    rows = [(f"{' '.join(rng.choices(WORDS, k=4))}", f"{' '.join(rng.choices(WORDS, k=5))}") for _ in range(200)]
    path = tmp_path / "pairs.tsv"
    path.write_text("".join(f"{s}\t{t}\n" for s, t in rows), encoding="utf-8")
    corpus = encode_pairs(str(path), cache_dir=tmp_path / "c")
    index = novelty.index_corpus(corpus, 0.1, log=lambda *a: None)
    from chargpt.data.pairs import split_pairs
    train, val = split_pairs(len(rows), 0.1)
    report = index.score(rows[train[7]][1])
    assert report.train.copied_fraction == 1.0 and report.unit == "pair" and report.train.longest.line == train[7] + 1
    assert report.train.longest.excerpt == rows[train[7]][1]
    assert report.train.longest.context.endswith(rows[train[7]][0][-5:] + "\t")  # its source, before a tab
    report = index.score(rows[val[3]][1])
    assert report.val.copied_fraction == 1.0 and report.val.longest.line == val[3] + 1


def test_sampled_text_is_scored_as_a_line_per_sample_or_a_json_field(text_index):
    text, index = text_index
    said = []
    record = novelty.sample_records(index.score, 2, as_json=False, say=said.append)
    assert record(1, at_line(text, 57, 30)) == {} and said == ["sample 2: " + index.score(at_line(text, 57, 30)).line()]
    record = novelty.sample_records(index.score, 1, as_json=True, say=said.append)
    assert record(0, at_line(text, 57, 30))["novelty"]["longest_line"] == 57 and len(said) == 1
    assert novelty.sample_records(None, 1, as_json=True, say=said.append) is None
    assert novelty.scored_line(index.score("x"), 0, 1).startswith("copied: ")


@pytest.mark.parametrize("wanted, min_span, data, interactive, said", [
    (False, 12, None, False, "--min-span and --data go with --novelty"),
    (False, None, "corpus.txt", False, "--min-span and --data go with --novelty"),
    (True, None, None, True, "--novelty scores printed samples, not --interactive ones"),
])
def test_novelty_options_of_sampling_are_checked(wanted, min_span, data, interactive, said):
    with pytest.raises(chargpt.ChargptError, match=said):
        novelty.check_options(wanted, min_span, data, interactive)
    novelty.check_options(True, 12, "corpus.txt", False)
    novelty.check_options(False, None, None, True)


# --- a run's own corpus, and the commands ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(run directory, corpus path, corpus text, its log lines): a tiny run that samples (and scores) every 5
    steps."""
    root = tmp_path_factory.mktemp("novelty_run")
    text = verse(seed=9)
    corpus = root / "verse.txt"
    corpus.write_text(text, encoding="utf-8")
    logs = []
    chargpt.train(data=str(corpus), out_dir=str(root / "run"), cache_dir=str(root / "cache"), max_iters=10,
                  eval_interval=5, sample_every=5, sample_chars=40, **{**TINY, "log": logs.append})
    return root / "run", corpus, text, logs


def test_samples_written_while_training_record_their_novelty(run):
    rows = [json.loads(line) for line in (run[0] / "samples.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [5, 10]
    for r in rows:
        assert set(r["novelty"]) >= {"copied_fraction", "min_span", "longest", "longest_line"}
        assert r["novelty"]["min_span"] == 20 and 0 <= r["novelty"]["copied_fraction"] <= 1
    shown = [line for line in run[3] if line.startswith("--- sample at step")]
    assert len(shown) == 2 and all(line.splitlines()[-1].startswith("copied: ") for line in shown)


def test_novelty_command_finds_the_run_s_corpus_and_prints_spans(run):
    _, _, text, _ = run
    done = run_chargpt("novelty", "--checkpoint", run[0], at_line(text, 44, 60))  # as a user runs it
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "copied: 100% in spans of 20+; longest 60 chars, from line 44"
    assert "line 44" in done.stdout.splitlines()[2]
    done = invoke(novelty_cli, "--checkpoint", run[0], "--json", "--min-span", "12", at_line(text, 44, 60))
    out = json.loads(done.stdout)
    assert out["copied_fraction"] == 1.0 and out["min_span"] == 12 and out["longest"] == 60
    assert out["longest_line"] == 44 and out["train"]["starting"][:3] == [60, 59, 58]
    assert out["train"]["ending"][-1] == 60 and 0 < out["val"]["copied_fraction"] < 1  # 12+: chance phrases too
    assert out["train"]["spans"][0]["line"] == 44


def test_novelty_reads_input_files_and_refuses_bad_input(run, tmp_path):
    _, _, text, _ = run
    f = tmp_path / "sample.txt"
    f.write_text(at_line(text, 8, 50), encoding="utf-8")
    done = invoke(novelty_cli, "--checkpoint", run[0], "--input", f)
    assert done.exit_code == 0 and "from line 8" in done.stdout
    for args, said in ((["--input", f, "also text"], "one of them"), ([], "one of them"),
                       (["--min-span", "0", "x"], "--min-span"), (["--input", tmp_path / "no.txt"], "cannot read")):
        done = invoke(novelty_cli, "--checkpoint", run[0], *args)
        assert done.exit_code == 1 and done.stderr.startswith("error: ") and said in done.stderr


def test_a_missing_corpus_asks_for_data_and_checks_it_by_hash(run, tmp_path):
    run_dir, corpus, text, _ = run
    moved = tmp_path / "run"
    shutil.copytree(run_dir, moved)
    elsewhere = tmp_path / "kept.txt"
    shutil.copy(corpus, elsewhere)
    cache = run_dir.parent / "cache"
    try:
        corpus.rename(corpus.with_suffix(".gone"))
        done = invoke(novelty_cli, "--checkpoint", moved, at_line(text, 5, 30))  # found by its recorded cache key
        assert done.exit_code == 0 and "from line 5" in done.stdout, done.stderr
        cache.rename(cache.with_suffix(".gone"))  # the recorded cache entry is gone too
        done = invoke(novelty_cli, "--checkpoint", moved, "some text")
        assert done.exit_code == 1 and len(done.stderr.strip().splitlines()) == 1
        assert "is gone" in done.stderr and "--data FILE" in done.stderr
        other = tmp_path / "other.txt"
        other.write_text(text.replace("king", "kings"), encoding="utf-8")
        done = invoke(novelty_cli, "--checkpoint", moved, "--data", other, "some text")
        assert done.exit_code == 1 and "hash differs" in done.stderr
        done = invoke(novelty_cli, "--checkpoint", moved, "--data", elsewhere, at_line(text, 5, 30))
        assert done.exit_code == 0 and "from line 5" in done.stdout, done.stderr
    finally:
        corpus.with_suffix(".gone").rename(corpus)
        shutil.rmtree(cache, ignore_errors=True)  # what --data encoded there
        cache.with_suffix(".gone").rename(cache)


def test_sample_novelty_prints_a_line_per_sample_and_a_json_object(run, tmp_path):
    done = invoke(sample_cli, "--checkpoint", run[0], "--novelty", "--max-new-tokens", "30", "--num-samples", "2",
                  "--seed", "3", "--device", "cpu")
    assert done.exit_code == 0, done.stderr
    lines = [x for x in done.stderr.splitlines() if "copied:" in x]
    assert len(lines) == 2 and lines[0].startswith("sample 1: copied: ") and "in spans of 20+" in lines[0]
    assert "copied" not in done.stdout  # stdout keeps the text alone
    done = invoke(sample_cli, "--checkpoint", run[0], "--novelty", "--json", "--min-span", "8",
                  "--max-new-tokens", "30", "--seed", "3", "--device", "cpu")
    record = json.loads(done.stdout)
    assert set(record["novelty"]) >= {"copied_fraction", "min_span", "longest", "longest_line"}
    assert record["novelty"]["min_span"] == 8
    done = invoke(sample_cli, "--checkpoint", run[0], "--novelty", "--output", tmp_path / "s.txt", "--seed", "3",
                  "--max-new-tokens", "30", "--device", "cpu")
    assert done.exit_code == 0 and (tmp_path / "s.txt").read_text(encoding="utf-8").strip()
    assert sum(line.startswith("copied: ") for line in done.stderr.splitlines()) == 1
    done = invoke(sample_cli, "--checkpoint", run[0], "--min-span", "5", "--device", "cpu")
    assert done.exit_code == 1 and "--novelty" in done.stderr


def test_the_playground_api_marks_copied_segments(run):
    need("starlette")
    from starlette.testclient import TestClient

    from chargpt.web import server as serve
    from chargpt.web.limits import MAX_NOVELTY_CHARS
    _, _, text, _ = run
    client = TestClient(serve.create_app(run[0].parent, device="cpu"), base_url="http://127.0.0.1")
    sample = "zz " + at_line(text, 20, 40)
    r = client.post("/api/novelty", json={"run": "run", "text": sample})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["segments"] == [{"start": 3, "end": 43, "line": 20, "excerpt": at_line(text, 20, 40), "context": ""}]
    assert body["summary"].startswith("copied: 93% in spans of 20+") and body["min_span"] == 20  # the run's default
    assert client.get("/api/runs").json()["runs"][0]["novelty_min_span"] == 20  # what the page offers by default
    r = client.post("/api/novelty", json={"run": "run", "text": sample, "min_span": 41})  # the page's own choice
    assert r.json()["min_span"] == 41 and r.json()["segments"] == []
    r = client.post("/api/novelty", json={"run": "run", "text": "x" * (MAX_NOVELTY_CHARS + 1)})
    assert r.status_code == 400 and "limit" in r.json()["error"]


def _tiny_run(root, text, corpus_name):
    """A tiny text run root/runs/r trained on `text`, written to root/<corpus_name>.txt (its corpus cache in
    root/cache) -> the corpus path."""
    corpus = root / f"{corpus_name}.txt"
    corpus.write_text(text, encoding="utf-8")
    chargpt.train(data=str(corpus), out_dir=str(root / "runs" / "r"), cache_dir=str(root / "cache"), max_iters=2,
                  eval_interval=2, sample_chars=0, **TINY)
    return corpus


def test_the_playground_reloads_the_index_of_a_run_replaced_under_its_name(tmp_path):
    """A run deleted and trained again under the same name on another text is scored against the new text (its
    checkpoint changed on disk, and with it the corpus it records), as the model cache reloads its model."""
    need("starlette")
    from starlette.testclient import TestClient

    from chargpt.web import server as serve
    old, new = verse(seed=21), verse(seed=22)
    _tiny_run(tmp_path, old, "old")
    client = TestClient(serve.create_app(tmp_path / "runs", device="cpu"), base_url="http://127.0.0.1")
    score = lambda text: client.post("/api/novelty", json={"run": "r", "text": text}).json()  # noqa: E731
    assert score(at_line(old, 5, 60))["copied_fraction"] == 1.0
    shutil.rmtree(tmp_path / "runs" / "r")
    _tiny_run(tmp_path, new, "new")
    assert score(at_line(new, 5, 60))["copied_fraction"] == 1.0
    assert score(at_line(new, 5, 60))["longest_line"] == 5 and score(at_line(old, 5, 60))["copied_fraction"] == 0


def test_the_playground_says_in_its_own_terms_that_a_run_s_text_is_gone(tmp_path):
    """The web error for a run whose training text is neither where it was nor in the cache says so without the
    server's paths or the command line's --data; chargpt novelty still names them."""
    need("starlette")
    from starlette.testclient import TestClient

    from chargpt.web import server as serve
    corpus = _tiny_run(tmp_path, verse(seed=23), "gone")
    corpus.unlink()
    shutil.rmtree(tmp_path / "cache")
    client = TestClient(serve.create_app(tmp_path / "runs", device="cpu"), base_url="http://127.0.0.1")
    r = client.post("/api/novelty", json={"run": "r", "text": "some text"})
    error = r.json()["error"]
    assert r.status_code == 422 and error.startswith("cannot mark copied text: the training text of the run 'r' is "
                                                     "not on this server")
    assert "--data" not in error and str(tmp_path) not in error and "/" not in error
    done = invoke(novelty_cli, "--checkpoint", tmp_path / "runs" / "r", "some text")
    assert done.exit_code == 1 and "pass --data FILE" in done.stderr and str(corpus) in done.stderr


def test_sample_novelty_refuses_a_missing_prompt_before_any_index_work(tmp_path):
    """sample.py --novelty on a pairs run without --prompt is refused before the index is built; with a prompt,
    the index is built when the first sample is scored."""
    train_pairs(write_cipher(tmp_path / "cipher.tsv", n=300), tmp_path / "run", steps=2, cache_dir=tmp_path / "cache")
    done = invoke(sample_cli, "--checkpoint", tmp_path / "run", "--novelty", "--device", "cpu")
    assert done.exit_code == 1 and "give --prompt some text" in done.stderr
    assert "indexing" not in done.stderr and not list((tmp_path / "cache").glob("*.sa-*.npy"))
    done = invoke(sample_cli, "--checkpoint", tmp_path / "run", "--novelty", "--prompt", "abcd", "--device", "cpu",
                  "--seed", "1")
    assert done.exit_code == 0 and "indexing" in done.stderr and "copied: " in done.stderr, done.stderr
    assert len(list((tmp_path / "cache").glob("*.sa-*.npy"))) == 2


def test_the_benchmark_runs_on_small_sizes():
    from chargpt.bench.novelty import bench, bench_one
    r = bench_one(n_chars=20_000, sample_chars=200)
    assert r["chars"] == 20_000 and r["score_chars"] == 200 and r["longest"] >= 100  # the first half is copied
    assert set(r) >= {"build_s", "build_extra_mb", "score_s", "builder"}
    (result,) = bench([{"n_chars": 5_000, "builder": "numpy"}], sample_chars=100)
    assert result["chars"] == 5_000 and result["builder"] == "numpy"
