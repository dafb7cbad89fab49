"""What a score says: the copied spans with their source lines, the summary of a text against a run's two splits
(the `novelty` object of sample.py --json and samples.jsonl, the one-line summary) and `chargpt novelty`'s output.
"""

import json
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Span:
    """A maximal copied span of the scored text: text[start:end] occurs at corpus position `offset`, which is on
    line `line` of the corpus (for sentence pairs: in pair number `line`). `excerpt` is the corpus text there (at
    most EXCERPT_CHARS of it), `context` what comes before it on its line (at most CONTEXT_CHARS): who speaks."""
    start: int
    end: int
    offset: int
    line: int
    excerpt: str
    context: str = ""

    @property
    def length(self):
        return self.end - self.start


@dataclass
class SplitScore:
    """A text against one split: per position, and its summary for min_span."""
    starting: np.ndarray  # (m,) the longest span starting at each position that occurs in the split
    ending: np.ndarray  # (m,) the longest one ending there
    copied: np.ndarray  # (m,) bool: inside a span of min_span or more
    spans: list = field(default_factory=list)  # [Span], maximal spans of min_span or more, in text order
    longest: Span | None = None  # the longest span (shorter than min_span too); None when nothing matches

    @property
    def copied_fraction(self):
        return float(self.copied.mean()) if len(self.copied) else 0.0


@dataclass
class Report:
    text: str
    min_span: int
    unit: str  # "line" or "pair": what `line` numbers count
    train: SplitScore
    val: SplitScore

    def summary(self):
        """The `novelty` object of sample.py --json and samples.jsonl."""
        t, v = self.train, self.val
        return {"copied_fraction": round(t.copied_fraction, 4), "min_span": self.min_span,
                "longest": t.longest.length if t.longest else 0, "longest_line": t.longest.line if t.longest else None,
                "longest_excerpt": t.longest.excerpt if t.longest else "", "unit": self.unit,
                "val_copied_fraction": round(v.copied_fraction, 4), "val_longest": v.longest.length if v.longest else 0}

    def line(self):
        """The one-line summary (format_summary)."""
        return format_summary(self)

    def to_json(self, positions=True):
        """Everything, for `chargpt novelty --json` and the playground: per split its share, longest span and
        spans (with `positions`, also the per-character starting and ending lengths)."""
        out = {"chars": len(self.text), **self.summary()}
        for name, s in (("train", self.train), ("val", self.val)):
            out[name] = {"copied_fraction": round(s.copied_fraction, 4),
                         "longest": _span_json(s.longest) if s.longest else None,
                         "spans": [_span_json(x) for x in s.spans]}
            if positions:
                out[name].update(starting=s.starting.tolist(), ending=s.ending.tolist())
        return out


def segments(spans):
    """Maximal spans (which may overlap) -> the non-overlapping pieces a page shades, each with its span's source:
    [{start, end, line, excerpt, context}], in text order; a character belongs to the first span that holds it."""
    out, reach = [], 0
    for x in spans:
        if x.end > reach:
            out.append({"start": max(x.start, reach), "end": x.end, "line": x.line, "excerpt": x.excerpt,
                        "context": x.context})
            reach = x.end
    return out


def _span_json(s):
    return {"start": s.start, "end": s.end, "length": s.length, "offset": s.offset, "line": s.line,
            "excerpt": s.excerpt, "context": s.context}


def format_summary(report):
    """One line: copied: 23% in spans of 20+; longest 57 chars, from line 2,317 (validation text: 2%)."""
    s = report.summary()
    line = f"copied: {s['copied_fraction']:.0%} in spans of {s['min_span']}+; longest {s['longest']} chars"
    if s["longest"]:
        line += f", from {report.unit} {s['longest_line']:,}"
    if s["val_copied_fraction"]:
        line += f" (from the validation text: {s['val_copied_fraction']:.0%})"
    return line


def format_report(report):
    """`chargpt novelty`'s text output: the summary, then each split's copied spans with their sources."""
    out = [format_summary(report)]
    for name, s in (("training", report.train), ("validation", report.val)):
        if not s.spans:
            out.append(f"{name} text: no span of {report.min_span}+ characters")
            continue
        out.append(f"{name} text: {len(s.spans)} span(s) of {report.min_span}+ characters ({s.copied_fraction:.0%} "
                   f"of the text)")
        out += [f"  {x.length:>5} chars at {x.start}-{x.end}, {report.unit} {x.line:,}"
                + (f" after {_shown(x.context)}" if x.context else "") + f": {_shown(x.excerpt)}" for x in s.spans]
    return "\n".join(out)


def _shown(text):
    return json.dumps(text, ensure_ascii=False)
