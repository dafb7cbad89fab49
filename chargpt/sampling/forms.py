"""Forms: the shape a sample must take, character by character (sample.py --form, --acrostic).

    _          one text character: a letter or an ideograph (str.isalpha): no punctuation, digit, space or line break
    *          a free span on the current line: the model writes what it likes until it writes the fixed text that
               follows (up to its first line break, when it has one; the rest is then written for it); after FREE_SPAN
               characters (or when the rest of the form would no longer fit --max-new-tokens) the rest of that text
               is written for it. A span writes a line break only as part of that text. A * must be followed by fixed
               text, or end the form: then it ends with its line (the line break is written).
    \\_ \\* \\\\   the characters _ * and \\ themselves; \\n is a line break and \\t a tab
    any other  fixed: written as given (fed to the model, never sampled)

So `_____，_____。\\n_____，_____。` is a five-character quatrain laid out as the Tang corpus lays it out (a couplet a
line), and `*.\\n*.\\n` two sentences on two lines. --form NAME takes a named shape (SHAPES; --forms lists them).

--acrostic 春夏秋冬 puts those characters at the start of successive lines of the form: a line starts at the form's
start and after a fixed line break, or after a full-width ，。！？； (in Chinese each verse of a couplet is a line),
and takes an acrostic character if it starts with a _ (which it replaces) or a * (which then follows it). Without
--form, the lines are the sample's own: each acrostic character starts the next line the model begins, and the
sample ends where the line of the last one ends.

A form is compiled against a model's vocabulary (compile_form: a fixed character it never saw, or no text character
at all, is a one-line error before any decoding) into a Program: its elements in ids and a small table of masks
over the vocabulary (anything allowed, a text character, a line end, and one row per fixed character). A batch
of samples walks it (FormWalk): at each step every row names the mask row that applies to it, so a step costs one
gather of B rows, whatever the vocabulary's size.
"""

import re
from dataclasses import dataclass

import torch

from chargpt.config.flags import param
from chargpt.errors import ConfigError

FREE_SPAN = 100  # the longest free span (*, or an acrostic line) before its closing fixed part is written for it
LINE_ENDS = "\n，。！？；"  # what ends a line for --acrostic: a line break, or a full-width verse end
ESCAPES = {"_": "_", "*": "*", "\\": "\\", "n": "\n", "t": "\t"}
# name -> (pattern, what it is). Tang poems are laid out a couplet a line (`chargpt data get tang`), so a quatrain
# is two lines of two verses.
SHAPES = {
    "五言绝句": ("_____，_____。\n_____，_____。", "five-character quatrain (wujue): 4 verses of 5"),
    "七言绝句": ("_______，_______。\n_______，_______。", "seven-character quatrain (qijue): 4 verses of 7"),
    "五言律诗": ("\n".join(["_____，_____。"] * 4), "five-character regulated verse (wulu): 8 verses of 5"),
    "七言律诗": ("\n".join(["_______，_______。"] * 4), "seven-character regulated verse (qilu): 8 verses of 7"),
}
ALIASES = {"wujue": "五言绝句", "五言絕句": "五言绝句", "五绝": "五言绝句", "五絕": "五言绝句",
           "qijue": "七言绝句", "七言絕句": "七言绝句", "七绝": "七言绝句", "七絕": "七言绝句",
           "wulu": "五言律诗", "五言律詩": "五言律诗", "五律": "五言律诗",
           "qilu": "七言律诗", "七言律詩": "七言律诗", "七律": "七言律诗"}
LINE_BREAKS = "\n\r"  # what a free span writes only as part of its closing text
# rows of Program.table before the fixed characters' own: anything allowed, a text character, a line end, anything
# on the same line, nothing
ANY, TEXT, LINE_END, SAME_LINE, NONE = range(5)


def shape_lines():
    """The named forms, one line each, for --forms."""
    names = {name: [a for a, to in ALIASES.items() if to == name] for name in SHAPES}
    return [f"{name} ({', '.join(names[name])}): {about}; {shown(pattern)}" for name, (pattern, about) in
            SHAPES.items()]


def shown(pattern):
    return pattern.replace("\n", "\\n").replace("\t", "\\t")


def resolve(form):
    """--form's value -> the pattern: a named shape's, or the value itself."""
    name = ALIASES.get(form, form)
    return SHAPES[name][0] if name in SHAPES else form


def parse(form):
    """A pattern (or shape name) -> its items: ("fixed", text), ("slot", None) for _, ("free", None) for *."""
    pattern = resolve(form)
    items, fixed, i = [], "", 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            if i + 1 == len(pattern) or pattern[i + 1] not in ESCAPES:
                after = "its end" if i + 1 == len(pattern) else repr(pattern[i + 1])
                raise ConfigError(f"{param('form')}: a \\ before {after} escapes nothing; \\_ \\* \\\\ \\n and \\t "
                                  f"are the escapes")
            fixed += ESCAPES[pattern[i + 1]]
            i += 2
            continue
        if c in "_*":
            items += [("fixed", fixed)] if fixed else []
            items.append(("slot" if c == "_" else "free", None))
            fixed = ""
        else:
            fixed += c
        i += 1
    items += [("fixed", fixed)] if fixed else []
    if not any(kind != "fixed" for kind, _ in items):
        raise ConfigError(f"{param('form')} {shown(form)[:40]!r} is neither a named form ({', '.join(SHAPES)}; "
                          f"--forms lists them) nor a pattern (it has no _ or *)")
    for (kind, _), (after, _) in zip(items, items[1:]):
        if kind == "free" and after != "fixed":
            raise ConfigError(f"{param('form')}: a * must be followed by fixed text (it ends when the model writes "
                              f"that text) or end the form; write \\* for the character *")
    return items


def line_starts(items):
    """Indices of the items that start a line and can take an acrostic character (a _ or a *)."""
    return [i for i, (kind, _) in enumerate(items) if kind != "fixed" and
            (i == 0 or (items[i - 1][0] == "fixed" and items[i - 1][1][-1] in LINE_ENDS))]


def with_acrostic(items, chars):
    """The form's items with the acrostic's characters at the starts of its lines."""
    starts = line_starts(items)
    if len(chars) > len(starts):
        raise ConfigError(f"{param('acrostic')} has {len(chars)} characters, but the form has only {len(starts)} "
                          f"line(s) that start with _ or *")
    out = list(items)
    for i, c in reversed(list(zip(starts, chars))):  # not merged into the fixed part before: a * before it ends
        out[i:i + 1] = [("fixed", c)] + ([out[i]] if out[i][0] == "free" else [])  # with its own fixed part
    return out


def acrostic_items(chars, at_line_start):
    """Without a form: each acrostic character starts a line the model then finishes ("line": free until a line
    end). A prompt that ends inside a line finishes that line first."""
    items = [] if at_line_start else [("line", None)]
    for c in chars:
        items += [("fixed", c), ("line", None)]
    return items


@dataclass
class Program:
    """A form compiled against a vocabulary: elements ("fixed", ids), ("slot", None), ("free", ids of the fixed part
    that ends it, or None at the form's end), ("line", None); table (K, V) bool, the masks rows choose from; fixed_row,
    a fixed id's row in it; need[e], the fewest characters that finish the form from element e; fail, the KMP
    failure function of each free span's closing part; line_end_ids; most, the most characters the form can take
    (every free span at FREE_SPAN, its closing part written for it), where its sample ends at the latest."""
    elements: list
    table: torch.Tensor
    fixed_row: dict
    need: list
    fail: dict
    line_end_ids: frozenset
    most: int


def compile_form(form, acrostic, vocab, allowed, context):
    """--form and --acrostic -> a Program for this vocabulary, or None for neither. `allowed` (V,) bool: what --ban
    and --allow leave; `context`: the text before the sample (does it end a line?). Every way the vocabulary cannot
    satisfy the form is a one-line ConfigError here, before decoding. (A --max-new-tokens shorter than the form cuts
    it, as a stop string does: Program.need[0] says how long it is at least.)"""
    if not form and not acrostic:
        return None
    for c in acrostic or "":
        _check_char(c, vocab, allowed, "acrostic", "the acrostic")
    items = parse(form) if form else acrostic_items(acrostic, not context or context[-1] in LINE_ENDS)
    if form:
        for c in dict.fromkeys(c for kind, text in items if kind == "fixed" for c in text):  # in order
            _check_char(c, vocab, allowed, "form", "the form")
        items = with_acrostic(items, acrostic or "")
    text = torch.tensor([c.isalpha() for c in vocab.chars]) & allowed
    ends = torch.tensor([c in LINE_ENDS for c in vocab.chars]) & allowed
    if any(kind == "slot" for kind, _ in items) and not text.any():
        raise ConfigError(f"{param('form')} has _ slots for letters or ideographs, but this model's vocabulary has "
                          f"none" + (" that --ban and --allow leave" if text.numel() and not allowed.all() else ""))
    if any(kind == "line" for kind, _ in items) and not ends.any():
        raise ConfigError(f"{param('acrostic')} without {param('form')} starts lines, but this model's vocabulary has "
                          f"no line break (or full-width verse end) it may write; give a form")
    if items[-1][0] == "free" and "\n" in vocab.stoi and allowed[vocab.stoi["\n"]]:
        items = items + [("fixed", "\n")]  # a * that ends the form ends with its line
    ids = sorted({vocab.stoi[c] for kind, t in items if kind == "fixed" for c in t})
    fixed_row = {i: 5 + k for k, i in enumerate(ids)}
    same_line = allowed & ~torch.tensor([c in LINE_BREAKS for c in vocab.chars])
    table = torch.stack([allowed, text, ends, same_line, torch.zeros_like(allowed)] +
                        [torch.nn.functional.one_hot(torch.tensor(i), len(vocab)).bool() for i in ids])
    elements = []
    for k, (kind, t) in enumerate(items):
        if kind == "fixed":
            elements.append(("fixed", [vocab.stoi[c] for c in t]))
        elif kind == "free":
            closing = items[k + 1][1] if k + 1 < len(items) else ""  # up to its first line break, if any
            closing = closing[:closing.index("\n") + 1] if "\n" in closing else closing
            elements.append(("free", [vocab.stoi[c] for c in closing] if closing else None))
        else:
            elements.append((kind, None))
    need = [0] * (len(elements) + 1)
    for e in range(len(elements) - 1, -1, -1):
        kind, ids_ = elements[e]
        need[e] = need[e + 1] + (len(ids_) if kind == "fixed" else 0 if kind == "free" else 1)
    fail = {e: _failure(ids_) for e, (kind, ids_) in enumerate(elements) if kind == "free" and ids_}
    most = sum(len(ids_) if kind == "fixed" else 1 if kind == "slot" else FREE_SPAN + len(ids_ or ()) + 1
               for kind, ids_ in elements)  # a free span's closing part may be written over again: counted twice
    return Program(elements, table, fixed_row, need, fail, frozenset(int(i) for i in ends.nonzero().flatten()), most)


def _check_char(c, vocab, allowed, name, what):
    if c not in vocab.stoi:
        raise ConfigError(f"{param(name)}: {what}'s character {c!r} (U+{ord(c):04X}) is not in this model's "
                          f"vocabulary (it never saw it in training)")
    if not allowed[vocab.stoi[c]]:
        raise ConfigError(f"{param(name)}: {what} writes {c!r}, which {param('ban')} or {param('allow')} rules out")


def _failure(ids):
    """KMP's failure function: fail[j] is the length of the longest proper prefix of ids[:j+1] that is also its
    suffix (how much of the closing part is still matched after a mismatch)."""
    fail, k = [0] * len(ids), 0
    for j in range(1, len(ids)):
        while k and ids[j] != ids[k]:
            k = fail[k - 1]
        k += ids[j] == ids[k]
        fail[j] = k
    return fail


class FormWalk:
    """Where each row of a batch is in a Program. masks() -> each row's mask row (closing the free spans that must
    end); advance(ids) moves every row past the character it wrote -> the rows whose form just ended (with it).
    Per step the work is a few Python operations per row, none per vocabulary entry."""

    def __init__(self, program, rows, budget):
        self.p, self.budget = program, budget  # budget: characters still to be written, this one included
        self.e, self.o, self.n = [0] * rows, [0] * rows, [0] * rows  # element; offset or match; span length
        self.ended = [False] * rows

    def masks(self):
        """-> two lists of mask rows, one entry per row of the batch: what a row may write is the union of its two."""
        p, first, second = self.p, [], []
        for r, e in enumerate(self.e):
            kind, ids = p.elements[e] if e < len(p.elements) else (None, None)
            extra = NONE
            if kind == "fixed":
                row = p.fixed_row[ids[self.o[r]]]
            elif kind == "slot":
                row = TEXT
            elif kind in ("free", "line") and (self.n[r] >= FREE_SPAN or self.budget - 1 < p.need[e]) and \
                    (kind == "line" or ids):  # must end now: its closing part is written for it
                if kind == "line":
                    row = LINE_END
                else:
                    self.e[r], self.n[r] = e + 1, 0  # on into the fixed part, as far as the span already matched it
                    row = p.fixed_row[p.elements[e + 1][1][self.o[r]]]
            elif kind == "free":  # on its line, or on into its closing text
                row, extra = SAME_LINE, p.fixed_row[ids[self.o[r]]] if ids else NONE
            else:  # an acrostic's line, or past the form's end
                row = ANY
            first.append(row)
            second.append(extra)
        return first, second

    def advance(self, ids):
        p, done = self.p, []
        for r, c in enumerate(ids):
            e = self.e[r]
            if self.ended[r]:
                continue
            kind, want = p.elements[e]
            if kind == "fixed":
                self.o[r] += 1
                if self.o[r] == len(want):
                    self.e[r], self.o[r] = e + 1, 0
            elif kind == "slot":
                self.e[r] += 1
            elif kind == "line":
                self.n[r] += 1
                if c in p.line_end_ids:
                    self.e[r], self.n[r] = e + 1, 0
            else:
                self.n[r] += 1
                if want is None:  # a free span that ends the form: up to FREE_SPAN characters
                    self.e[r] += self.n[r] >= FREE_SPAN
                else:
                    k, fail = self.o[r], p.fail[e]
                    while k and want[k] != c:
                        k = fail[k - 1]
                    k += want[k] == c
                    self.o[r] = k
                    if k == len(want):  # the model wrote the closing part itself: on with the rest of it, if any
                        rest = len(p.elements[e + 1][1]) > k
                        self.e[r], self.o[r], self.n[r] = e + 1 + (not rest), k if rest else 0, 0
            if self.e[r] >= len(p.elements):
                self.ended[r] = True
                done.append(r)
        self.budget -= 1
        return done


# --- where text of a form's shape starts ------------------------------------------------------------------------
START_CONTEXT = 48  # characters before a shape's start that a form without a prompt is conditioned on
MAX_STARTS = 1000  # of which the starts found are kept (the first, in the text's order)


def shape_regex(items):
    """A form's items (parse) -> the regex of text of its shape: _ one letter or ideograph, * text on its line."""
    free = r"[^\n]{0," + str(FREE_SPAN) + "}?"
    return "".join(re.escape(t) if kind == "fixed" else r"[^\W\d_]" if kind == "slot" else free for kind, t in items)


def shape_starts(form, text, limit=START_CONTEXT):
    """Where text of the form's shape starts in `text` (a run's training text): at a line start, after a line that is
    not itself the start of such text (a poem's first verse, not its second) -> up to MAX_STARTS contexts, each the
    `limit` characters (at most) before one, from a line start: what a form without a prompt is conditioned on, so that
    it begins where the corpus begins text of that shape (a Tang quatrain after its author's line) and not wherever
    a newline leads (its titles and authors)."""
    items = parse(form)
    whole = re.compile(shape_regex(items))
    first = items[:next((k + 1 for k, (kind, t) in enumerate(items) if kind == "fixed" and "\n" in t), len(items))]
    first_line = re.compile(shape_regex(first))
    starts = []
    for m in re.finditer(r"(?:^|(?<=\n))(?=" + whole.pattern + ")", text):
        line_before = text.rfind("\n", 0, max(m.start() - 1, 0)) + 1
        if m.start() and first_line.match(text, line_before):
            continue  # inside a run of such lines: not where one starts
        lo = m.start() - limit  # from the line start after it (the text's start, if that is nearer)
        begin = 0 if lo <= 0 else text.find("\n", lo, m.start()) + 1 or lo
        if text[begin:m.start()]:
            starts.append(text[begin:m.start()])
        if len(starts) >= MAX_STARTS:
            break
    return starts
