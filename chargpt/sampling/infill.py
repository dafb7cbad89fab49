"""Fill in the middle at sampling time: a run trained with --fim (chargpt/data/fim.py) given --suffix AFTER reads
PRE SUF suffix MID prompt and writes the middle on from the prompt, which ends where the model writes END (not
written) or at --max-new-tokens; a --form or a pattern ends it where it is complete.

    python sample.py --prompt "name: ann; age: " --suffix "; city: oslo" --temperature 0

The engine (chargpt/sampling/engine.py) asks this module for the context's ids and what the decode loop keeps in its
window: the whole context stays first when a long middle makes the window slide (decode's `pin`), so the model always
reads both sides of the gap.
"""

from dataclasses import dataclass

from chargpt.config.flags import param
from chargpt.data.fim import ROLES
from chargpt.errors import ConfigError


@dataclass(frozen=True)
class Infill:
    """One infill's context as the model reads it, and what decoding needs of it."""
    ids: list  # PRE SUF suffix MID prompt, in the run's ids
    end: str  # the character that closes the middle: a stop string the text never shows
    note: str  # "" or the line saying how much of the prompt and the suffix the context holds


def no_fim(what=None):
    """The one-line error for --suffix on a run trained without --fim."""
    return ConfigError(f"this run was trained without {param('fim')}, so it cannot fill in the middle; drop "
                       f"{what or param('suffix')}, or teach it in a new run: {param('init_from')} RUN "
                       f"{param('fim', 0.5)}")


def room(block_size, pinned_before=0):
    """Characters of prompt and suffix together the context may hold: the four markers and the text must stay
    under 3/4 of the window (decode keeps that much, the context first, when the window slides), so a middle always
    has a quarter of the window to be written in."""
    return max(0, (3 * block_size) // 4 - len(ROLES) - pinned_before - 1)


def plan(markers, vocab, prompt, suffix, block_size, pinned_before=0):
    """-> Infill: the markers around the prompt's end and the suffix's start, as much of each as fits (the text
    nearest the gap first: half of the room each, the rest to the other where one is shorter)."""
    fits = room(block_size, pinned_before)
    half = fits // 2
    a = min(len(prompt), max(half, fits - len(suffix)))
    b = min(len(suffix), fits - a)
    before, after = prompt[len(prompt) - a:], suffix[:b]
    note = ""
    if (a, b) != (len(prompt), len(suffix)):
        note = (f"note: the model reads the last {a} characters of the prompt and the first {b} of the suffix (its "
                f"context holds {block_size}, and the middle needs room)")
    return Infill(vocab.encode(markers.context(before, after)), markers.end, note)
