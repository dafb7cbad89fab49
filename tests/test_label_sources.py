"""Which file is which label (--labels folders|files|MANIFEST.tsv, chargpt/data/labels.py): a manifest that is not
UTF-8 is a one-line error, one that starts with a byte-order mark reads as the text it is, and a label whose files
are all left out of the corpus (not text) is an error naming the file, not a label that silently vanishes; and the
per-label validation stops when a signal asks, as the rest of an evaluation does."""

import pytest
import torch
from helpers import TINY_FLAGS, assert_one_line_error, invoke

from chargpt.cli import train_cli
from chargpt.data import labels
from chargpt.data.labels import label_sources
from chargpt.errors import DataError
from chargpt.training.interrupt import StopRequested
from chargpt.training.tasks import Text


@pytest.fixture
def authors(tmp_path):
    for label, text in (("a", "abc abc cab\n" * 40), ("b", "xyz zyx yzx\n" * 40)):
        (tmp_path / "authors" / label).mkdir(parents=True)
        (tmp_path / "authors" / label / "one.txt").write_text(text, encoding="utf-8")
    return tmp_path / "authors"


def train(tmp_path, *args):
    return invoke(train_cli, [*TINY_FLAGS, "--max-iters", 1, "--out-dir", tmp_path / "run", "--cache-dir",
                              tmp_path / "cache", *args])


def test_a_manifest_that_is_not_utf8_is_a_one_line_error(authors, tmp_path):
    manifest = authors / "labels.tsv"
    manifest.write_bytes("a/one.txt\ta\nb/one.txt\tb\u00e9\n".encode("latin-1"))
    with pytest.raises(DataError, match=r"labels.tsv is not UTF-8 text \(byte 23\); save the manifest as UTF-8$"):
        label_sources(authors, str(manifest))
    assert_one_line_error(train(tmp_path, "--data", authors, "--labels", manifest), r"is not UTF-8 text \(byte 23\)")
    assert not (tmp_path / "run").exists()


def test_a_byte_order_mark_at_a_manifests_start_is_not_part_of_the_first_file_name(authors):
    manifest = authors / "labels.tsv"
    manifest.write_bytes(b"\xef\xbb\xbf" + b"a/one.txt\ta\nb/one.txt\tb\n")  # as Notepad saves UTF-8
    name, sources, labels = label_sources(authors, str(manifest))
    assert [s.name for s in sources] == ["a/one.txt", "b/one.txt"] and labels == ["a", "b"]


@pytest.mark.parametrize("how", ["folders", "files"])
def test_a_label_whose_only_file_is_not_text_is_an_error_naming_it(authors, tmp_path, how):
    (authors / "b" / "one.txt").write_bytes(b"xyz\x00zyx\n")  # left out of the corpus as binary
    if how == "files":
        (authors / "b" / "one.txt").rename(authors / "b" / "two.txt")
    name = "b/one.txt" if how == "folders" else "b/two.txt"
    label = "b" if how == "folders" else "two"
    with pytest.raises(DataError, match=rf"^labels='{how}': label '{label}' has no text file \({name} has a NUL byte "
                                        rf"at offset 3, so it is not text\); fix or remove it$"):
        label_sources(authors, how)
    assert_one_line_error(train(tmp_path, "--data", authors, "--labels", how), rf"label '{label}' has no text file")


def test_a_binary_file_beside_a_labels_text_files_is_still_left_out(authors):
    (authors / "b" / "cover.png").write_bytes(b"\x89PNG\x00\x00")
    _, sources, labels = label_sources(authors, "folders")
    assert [s.name for s in sources] == ["a/one.txt", "b/one.txt"] and labels == ["a", "b"]


def test_a_stop_during_the_per_label_validation_abandons_it():
    """A signal during an evaluation is said to abandon it; with 10,000 labels the per-label losses are most of it,
    so their loop checks the flag before every batch too, through the task the trainer calls."""
    class Batches:  # 50 labels of random windows
        names = [f"l{k}" for k in range(50)]

        def get(self, split, gen, label):
            x = torch.randint(8, (2, 4), generator=gen)
            return x, x

    model = torch.nn.Linear(1, 1)
    model.forward = lambda x, targets: (None, torch.tensor(1.0))
    read = []

    def check_stop():
        if len(read) == 3:
            raise StopRequested
        read.append(1)

    with pytest.raises(StopRequested):
        labels.label_losses(model, Batches(), 2, torch.float32, check_stop=check_stop)
    assert len(read) == 3 and model.training  # stopped at the fourth batch of 100, the model's mode restored
    read.clear()
    task = type("Labelled", (), {"labels": object(), "spans": dict.fromkeys(Batches.names), "eval_iters": 100,
                                 "label_batches": Batches()})()
    with pytest.raises(StopRequested):
        Text.scores(task, model, None, torch.float32, print, check_stop)
    assert len(read) == 3
