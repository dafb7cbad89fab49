"""The character vocabulary (chargpt/data/tokenizer.py): built from any text, encoding and decoding exactly, ids that
stay put when a vocabulary grows, and the policies for characters a model never saw."""

import numpy as np
import pytest

from chargpt.config.flags import cli_names
from chargpt.data.tokenizer import Vocab, codepoints, describe_chars
from chargpt.errors import ChargptError

TEXT = "To be, or not to be: 春眠不觉晓 😀 café\n\ttab"


def test_the_vocabulary_is_the_sorted_distinct_characters_of_the_text():
    vocab = Vocab.from_text("banana\n")
    assert vocab.chars == ["\n", "a", "b", "n"] and len(vocab) == 4
    assert Vocab.from_text(TEXT).chars == sorted(set(TEXT))


def test_encode_then_decode_gives_the_text_back_whatever_its_alphabet():
    vocab = Vocab.from_text(TEXT)
    ids = vocab.encode(TEXT)
    assert len(ids) == len(TEXT)  # one id per character: an emoji outside the BMP too
    assert vocab.decode(ids) == TEXT
    assert vocab.decode(np.array(ids, dtype=vocab.id_dtype)) == TEXT


def test_the_vectorised_encoder_agrees_with_the_plain_one():
    vocab = Vocab.from_text(TEXT)
    assert vocab.ids_from_codepoints(codepoints(TEXT)).tolist() == vocab.encode(TEXT)
    with pytest.raises(ChargptError, match=r"^2 characters are not in the vocabulary$"):
        vocab.ids_from_codepoints(codepoints("xx"))


def test_ids_fit_the_smallest_dtype():
    assert Vocab.from_text("abc").id_dtype == np.uint16
    assert Vocab.from_codepoints(np.arange(0x20000, 0x20000 + 70000)).id_dtype == np.uint32


def test_a_grown_vocabulary_keeps_every_old_id():
    base = Vocab.from_text("cab")
    grown = base.extended(Vocab.from_text("zebra"))
    assert grown.chars[:3] == base.chars and grown.chars[3:] == ["e", "r", "z"]
    assert grown.encode("cab") == base.encode("cab")


@pytest.mark.parametrize("chars,message", [
    ([], r"the vocabulary is empty"),
    (["a", "a"], r"distinct single characters"),
    (["ab"], r"distinct single characters"),
    (["a", "\ud800"], r"lone surrogate\(s\), U\+D800 first"),
])
def test_an_impossible_vocabulary_is_refused(chars, message):
    with pytest.raises(ChargptError, match=message):
        Vocab(chars)


# --- characters the model never saw ----------------------------------------------------------------------------
def test_unknown_characters_are_named_with_their_positions():
    vocab = Vocab.from_text("abc ")
    assert vocab.unknown("abXc!") == [(2, "X"), (4, "!")]
    with pytest.raises(ChargptError, match=r"prompt has 2 character\(s\) the model never saw: 'X' \(U\+0058\) at 2, "
                                           r"'!' \(U\+0021\) at 4; remove them, or pass unknown='skip' or "
                                           r"unknown='replace'"):
        vocab.encode("abXc!")
    with cli_names(), pytest.raises(ChargptError, match=r"pass --unknown skip or --unknown replace"):
        vocab.encode("X")


def test_skip_drops_and_replace_uses_the_first_stand_in_the_vocabulary_has():
    assert Vocab.from_text("abc ").decode(Vocab.from_text("abc ").encode("aXb", unknown="skip")) == "ab"
    for alphabet, stand_in in (("ab\ufffd? ", "\ufffd"), ("ab? ", "?"), ("ab ", " "), ("ab", "a")):
        vocab = Vocab.from_text(alphabet)
        assert vocab.replacement() == stand_in
        assert vocab.decode(vocab.encode("bX", unknown="replace")) == "b" + stand_in


def test_an_unknown_policy_that_does_not_exist_is_refused():
    with pytest.raises(ChargptError, match=r"unknown must be one of error, skip, replace \(got 'drop'\)"):
        Vocab.from_text("ab").encode("a", unknown="drop")


def test_describe_chars_lists_ten_and_counts_the_rest():
    found = [(i, "x") for i in range(13)]
    assert describe_chars(found[:1]) == "'x' (U+0078) at 0"
    assert describe_chars(found).endswith("at 9 and 3 more") and describe_chars(found).count("U+0078") == 10
