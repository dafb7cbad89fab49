"""The texts the New run view can train on, listed by name from a folder the server was given (chargpt/web/training.py):
its text files, and in the data folder its folders of texts, which train as one corpus or, with a labels choice, as
several labelled texts (chargpt train --data FOLDER --labels folders|files|MANIFEST.tsv: chargpt/data/labels.py).

A name is never a path: a request names an entry of a fresh listing, and only what is listed is trained on. Nothing
is listed whose name is hidden or holds a control character (it would garble the lines that show it), nor a file
whose real path leaves the folder (a symlink out of it); a folder is listed only if every file in it stays inside
the data folder, and only if it is small enough to check (MAX_FOLDER_FILES files).
"""

import contextlib
from pathlib import Path

from chargpt.web.body import RequestError
from chargpt.web.limits import MAX_CORPORA_LISTED, MAX_FOLDER_FILES, MAX_LISTING_FILES

LABELS = ("none", "folders", "files")  # the labels choices every folder has (a manifest: one of its .tsv files)
MANIFEST_SUFFIX = ".tsv"
MAX_MANIFEST_READ = 2**20  # bytes of a manifest checked (chargpt/data/labels.py refuses a larger one)


def inside(path, folder):
    real = Path(path).resolve()
    return real != Path(folder).resolve() and real.is_relative_to(Path(folder).resolve())


def size_of(path):
    try:
        return path.stat().st_size
    except OSError:
        return 0


def shown(name):
    """A name the page may show and a request may give: not hidden, printable (no newline, no escape sequence)."""
    return not name.startswith(".") and name.isprintable()


def texts(folder):
    """{name: path} of the texts directly in folder: regular files, not hidden (a download in progress is .NAME.part),
    not the folder's own README (data/README.md says what to put there), named in printable characters only, whose
    real path is inside folder."""
    if folder is None or not folder.is_dir():
        return {}
    found = {}
    with contextlib.suppress(OSError):
        for p in sorted(folder.iterdir()):
            if len(found) >= MAX_CORPORA_LISTED:
                break
            if shown(p.name) and p.stem.upper() != "README" and p.is_file() and inside(p, folder):
                found[p.name] = p
    return found


class TextFolder:
    """A folder of texts in the data folder: its files (what chargpt train --data FOLDER reads: every file below it,
    hidden ones left out), their bytes, and the labels choices it has."""

    def __init__(self, path, files):
        self.path, self.files = path, files
        top = [f for f in files if f.parent == path]
        self.labels = ["none", *(["folders"] if not top else []), "files",
                       *sorted(f.name for f in top if f.suffix.lower() == MANIFEST_SUFFIX)]

    def summary(self):
        return {"name": self.path.name, "kind": "folder", "bytes": sum(size_of(f) for f in self.files),
                "files": len(self.files), "labels": self.labels}

    def labels_flag(self, labels):
        """The page's labels choice -> chargpt train's --labels value (None: no labels), or the one-line 400 that
        lists this folder's choices."""
        if labels in (None, "none"):
            return None
        if labels not in self.labels:
            why = " (it has texts outside its subfolders: each subfolder is a label)" if labels == "folders" else ""
            raise RequestError(400, f"labels {labels!r} is not a choice for the folder {self.path.name}{why}; its "
                                    f"choices: {', '.join(self.labels)} (GET /api/corpora lists them)")
        if labels in LABELS:
            return labels
        self.check_manifest(self.path / labels)
        return str(self.path / labels)  # a manifest by its full path: the child runs elsewhere

    def check_manifest(self, manifest, most=MAX_MANIFEST_READ):
        """A manifest the page chose may list only files inside its folder (chargpt train reads any path a person's
        own manifest names; one the page starts must not reach past the folder it was given): else a 400."""
        try:
            with open(manifest, "rb") as f:
                text = f.read(most).decode("utf-8-sig", errors="replace")
        except OSError as e:
            raise RequestError(400, f"cannot read {manifest.name} ({e.strerror})") from None
        for n, line in enumerate(text.splitlines(), 1):
            name = line.split("\t", 1)[0]
            if name.strip() and not line.startswith("#") and not inside(self.path / name, self.path):
                raise RequestError(400, f"{manifest.name} line {n} names {name[:60]!r}, which is outside the folder "
                                        f"{self.path.name}; a manifest the page trains with lists the folder's own "
                                        f"files")


def text_folders(data_dir, budget=MAX_LISTING_FILES):
    """{name: TextFolder} of the folders directly in data_dir that hold at least one text file, all of whose files
    and folders are inside data_dir, shown names all, and at most MAX_FOLDER_FILES files; `budget` bounds the files
    looked at in all."""
    if data_dir is None or not data_dir.is_dir():
        return {}
    found = {}
    with contextlib.suppress(OSError):
        for p in sorted(data_dir.iterdir()):
            if len(found) >= MAX_CORPORA_LISTED or budget <= 0:
                break
            if not shown(p.name) or not p.is_dir() or not inside(p, data_dir):
                continue
            files, budget = _files_below(p, data_dir, budget)
            if files:
                found[p.name] = TextFolder(p, files)
    return found


def _files_below(folder, data_dir, budget):
    """(the files below folder, as chargpt train reads them, or None if the folder may not be listed; budget left)."""
    files = []
    try:
        for p in folder.rglob("*"):  # lazily: the budget bounds a huge folder (or a link loop) before it is read whole
            budget -= 1
            parts = p.relative_to(folder).parts
            if any(part.startswith(".") for part in parts):
                continue  # train skips hidden files and folders too
            if budget < 0 or len(files) >= MAX_FOLDER_FILES or not all(part.isprintable() for part in parts) \
                    or not inside(p, data_dir):
                return None, budget
            if p.is_file():
                files.append(p)
    except OSError:
        return None, budget
    return sorted(files) or None, budget
