"""Sentence pairs: reading TSV and aligned files, their format errors, the ids + loss mask on disk, the split,
and the batches of both layouts."""

import numpy as np
import pytest
import torch
from torch.nn import functional as F

import chargpt.data.pairs as pairs_module
from chargpt.config import ModelConfig
from chargpt.data.pairs import END, SEP, PairBatches, encode_pairs, split_pairs
from chargpt.errors import DataError
from chargpt.model.transformer import CharGPT

PAIRS = [("Hi.", "Ciao."), ("Run!", "Corri!"), ("Who?", "Chi?"), ("我很好。", "Sto bene."), ("I see.", "Capisco.")]


def write(path, text, encoding="utf-8"):
    path.write_bytes(text.encode(encoding))
    return path


def tsv(tmp_path, pairs=PAIRS, repeat=1, name="pairs.tsv"):
    return write(tmp_path / name, "".join(f"{s}\t{t}\n" for s, t in pairs * repeat))


def all_pairs(enc):
    return [enc.pair(i) for i in range(enc.n_pairs)]


def test_tatoeba_tsv_with_bom_crlf_extra_columns_and_blank_lines(tmp_path):
    """Anki/Tatoeba downloads work as they are: the attribution column is ignored, CRLF line ends and a BOM
    are not part of any sentence, blank lines are skipped."""
    text = "\ufeff" + "".join(f"{s}\t{t}\tCC-BY 2.0 (France) Attribution: tatoeba.org #{i}\r\n"
                              for i, (s, t) in enumerate(PAIRS)) + "\r\n\n"
    enc = encode_pairs(str(write(tmp_path / "ita.txt", text)))
    assert all_pairs(enc) == PAIRS
    assert "\r" not in enc.vocab.chars and "\ufeff" not in enc.vocab.chars
    assert SEP in enc.vocab.chars and END in enc.vocab.chars


def test_two_aligned_files_give_the_same_pairs(tmp_path):
    src = write(tmp_path / "en.txt", "".join(s + "\n" for s, _ in PAIRS) + "\n")  # a trailing blank line is fine
    tgt = write(tmp_path / "it.txt", "".join(t + "\r\n" for _, t in PAIRS))
    enc = encode_pairs(str(src), str(tgt))
    assert all_pairs(enc) == PAIRS
    assert isinstance(enc.ids(), np.memmap) and isinstance(enc.mask(), np.memmap)


def test_ids_and_mask_on_disk(tmp_path):
    """Each example is `source SEP target END`; the mask marks exactly the target and END."""
    enc = encode_pairs(str(tsv(tmp_path)))
    text = enc.vocab.decode(enc.ids())
    assert text == "".join(s + SEP + t + END for s, t in PAIRS)
    scored = "".join(c for c, m in zip(text, enc.mask()) if m)
    assert scored == "".join(t + END for _, t in PAIRS)


def test_second_encoding_comes_from_the_cache(tmp_path, monkeypatch):
    path = tsv(tmp_path)
    first = encode_pairs(str(path))
    monkeypatch.setattr(pairs_module, "iter_text", lambda *a, **k: pytest.fail("re-read cached pairs"))
    second = encode_pairs(str(path))
    assert second.paths == first.paths and all_pairs(second) == PAIRS
    monkeypatch.undo()
    aligned = encode_pairs(str(path), target_data=str(path)).paths  # same bytes, other layout: its own entry
    assert aligned != first.paths


@pytest.mark.parametrize("content,message", [
    ("Hi.\tCiao.\nRun!  Corri!\n", r"pairs.tsv:2 has no tab: 'Run!  Corri!'; each line must be source<TAB>target"),
    ("Hi.\tCiao.\n\tCorri!\n", r"pairs.tsv:2: the source is empty"),
    ("Hi.\tCiao.\nRun!\t\tx\n", r"pairs.tsv:2: the target is empty"),
    ("Hi.\tCi\ue000ao.\n", r"pairs.tsv:1: the target contains U\+E000, a private-use character chargpt reserves"),
    ("\n\r\n", r"has no sentence pairs"),
])
def test_tsv_format_errors_name_file_and_line(tmp_path, content, message):
    path = write(tmp_path / "pairs.tsv", content)
    with pytest.raises(DataError, match=message):
        encode_pairs(str(path), cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())  # nothing half-written


@pytest.mark.parametrize("src,tgt,message", [
    ("a\nb\nc\n", "x\ny\n", r"not aligned: en.txt:3 has no partner line \(the target file ends first\)"),
    ("a\n", "x\ny\n\n", r"not aligned: it.txt:2 has no partner line \(the source file ends first\)"),
    ("a\n\nc\n", "x\ny\nz\n", r"en.txt:2 \(target it.txt:2\): the source is empty"),
])
def test_aligned_file_errors_name_the_line(tmp_path, src, tgt, message):
    with pytest.raises(DataError, match=message):
        encode_pairs(str(write(tmp_path / "en.txt", src)), str(write(tmp_path / "it.txt", tgt)))


def test_undecodable_bytes_and_missing_data_are_clear(tmp_path):
    path = tmp_path / "bad.tsv"
    path.write_bytes(b"ok\tfine\ncaf\xe9\tcoffee\n")
    with pytest.raises(DataError, match="bad.tsv is not valid utf-8: undecodable byte 0xe9 at byte offset 11"):
        encode_pairs(str(path))
    with pytest.raises(DataError, match="sentence pairs need --data"):
        encode_pairs(None)


def test_validation_split_is_whole_pairs_fixed_and_spread_over_lengths():
    train, val = split_pairs(1000, 0.1)
    assert len(val) == 100 and len(np.intersect1d(train, val)) == 0 and len(np.union1d(train, val)) == 1000
    assert np.array_equal(split_pairs(1000, 0.1)[1], val)  # the same pairs every run
    assert val.min() < 100 and val.max() > 900  # a file sorted by length has short and long pairs in both
    with pytest.raises(DataError, match="empty validation split"):
        split_pairs(5, 0.1)


def numbered_pairs(n):
    return [(f"s{i}" + "x" * (i % 7), f"t{i}" + "y" * (i % 5)) for i in range(n)]


def test_decoder_batches_and_loss_mask(tmp_path):
    """x is `source SEP target`, y the same shifted by one; the mask counts exactly the target and END."""
    enc = encode_pairs(str(tsv(tmp_path, numbered_pairs(200))))
    batches = PairBatches(enc, 0.1, block_size=24, batch_size=8, device="cpu")
    b = batches.get("train", torch.Generator().manual_seed(0))
    assert set(b) == {"idx", "targets", "loss_mask"} and b["idx"].shape == b["targets"].shape == b["loss_mask"].shape
    for x, y, m in zip(b["idx"], b["targets"], b["loss_mask"]):
        example = enc.vocab.decode(x[:1].tolist() + y[: int(m.nonzero().max()) + 1].tolist())
        source, rest = example.split(SEP)
        target = rest.removesuffix(END)
        assert (source, target) in numbered_pairs(200)
        assert torch.equal(x[1:], y[:-1])  # shifted by one
        assert int(m.sum()) == len(target) + 1  # target + END counted, nothing else
        assert enc.vocab.decode(y[m].tolist()) == target + END


def test_loss_counts_target_terms_only(tmp_path):
    """Changing what the source side asks the model to predict changes no loss term; changing a target does."""
    enc = encode_pairs(str(tsv(tmp_path, numbered_pairs(100))))
    b = PairBatches(enc, 0.1, 24, 4, "cpu").get("train", torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    model = CharGPT(ModelConfig(vocab_size=len(enc.vocab), block_size=24, n_layer=1, n_head=2, n_embd=16,
                                dropout=0.0)).eval()
    logits, loss = model(**b)
    per = F.cross_entropy(logits.reshape(-1, len(enc.vocab)), b["targets"].reshape(-1), reduction="none")
    torch.testing.assert_close(loss, per[b["loss_mask"].reshape(-1)].mean())
    source_side = b["targets"].clone()
    source_side[~b["loss_mask"]] = (source_side[~b["loss_mask"]] + 1) % len(enc.vocab)
    assert torch.equal(model(b["idx"], source_side, loss_mask=b["loss_mask"])[1], loss)
    target_side = b["targets"].clone()
    target_side[0, b["loss_mask"][0].nonzero()[0]] += 1
    assert model(b["idx"], target_side, loss_mask=b["loss_mask"])[1] != loss


def test_encoder_decoder_batches(tmp_path):
    """src is the source (padding masked); tgt starts with SEP; targets end with END; padding is not counted."""
    enc = encode_pairs(str(tsv(tmp_path, numbered_pairs(200))))
    b = PairBatches(enc, 0.1, 12, 8, "cpu", arch="encoder-decoder").get("val", torch.Generator().manual_seed(0))
    assert set(b) == {"src", "src_mask", "tgt", "targets", "loss_mask"}
    for src, sm, tgt, y, m in zip(*(b[k] for k in ("src", "src_mask", "tgt", "targets", "loss_mask"))):
        source, target = enc.vocab.decode(src[sm].tolist()), enc.vocab.decode(y[m].tolist()).removesuffix(END)
        assert (source, target) in numbered_pairs(200)
        assert enc.vocab.decode(tgt[m].tolist()) == SEP + target
        assert not sm[len(source):].any() and not m[len(target) + 1:].any()


@pytest.mark.parametrize("arch,block,kept", [("decoder", 8, "s1x"), ("encoder-decoder", 3, "s1x")])
def test_pairs_longer_than_the_context_are_skipped_and_counted(tmp_path, arch, block, kept):
    """Rule: a pair that does not fit is skipped (never truncated), and the count is reported."""
    data = [("s1x", "t1y")] * 20 + [("s2xxxxxx", "t2")] * 5  # decoder needs 7 and 11; enc-dec 4 and 8
    enc = encode_pairs(str(tsv(tmp_path, data)))
    logged = []
    batches = PairBatches(enc, 0.2, block + (arch == "encoder-decoder"), 16, "cpu", arch=arch, log=logged.append)
    assert logged == [f"skipped 5 of 25 pairs longer than the context (--block-size {block + (arch != 'decoder')}); "
                      f"raise --block-size to train on them"]
    key = "idx" if arch == "decoder" else "src"
    for split in ("train", "val"):
        b = batches.get(split, torch.Generator().manual_seed(0))
        assert all(enc.vocab.decode(row.tolist()).startswith(kept) for row in b[key])
    with pytest.raises(DataError, match="no train pair fits the context of 2 characters; raise --block-size"):
        PairBatches(enc, 0.2, 2, 16, "cpu", arch=arch, log=logged.append)
