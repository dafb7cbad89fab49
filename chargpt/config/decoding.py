"""Two of SampleSettings' choices checked where the settings are made, kept out of config/__init__.py for its size:
beam search (--beam, --length-penalty: chargpt/sampling/beam.py) and a mix of labels (--label a:0.7,b:0.3, typed once
here as a LabelMix: chargpt/sampling/engine.py decodes one batch row per label and mixes them log-linearly).
"""

import math
from dataclasses import dataclass

from chargpt.config.flags import param
from chargpt.errors import ConfigError

MAX_BEAM = 1000  # hypotheses kept per step, as chargpt translate's --beam
MAX_ALPHA = 10.0  # --length-penalty, as translate's --alpha
MAX_MIXED = 16  # labels in one mix: each is one more batch row per sample


@dataclass(frozen=True)
class LabelMix:
    """--label as (name, weight) pairs, the weights positive and normalised to sum 1. One name alone (today's --label
    austen) is that label with weight 1. `single` is the one label's name, or None for a mix of two or more."""
    parts: tuple  # ((name, weight), ...), weights summing to 1

    @classmethod
    def parse(cls, text):
        """'austen' or 'austen:0.7,bronte:0.3' -> LabelMix; a one-line ConfigError for a malformed one. Which names the
        run has is checked when it decodes (LabelSet.token). A part without a weight weighs 1; a lone name is taken
        whole (a label named 'a:b' is still chosen as --label a:b), so ',' and ':' separate only in a mix."""
        pieces = text.split(",")
        if len(pieces) == 1 and not _weighted(text):
            return cls(((text, 1.0),))
        if len(pieces) > MAX_MIXED:
            raise ConfigError(f"{param('label')} mixes at most {MAX_MIXED} labels, got {len(pieces)}")
        parts = []
        for piece in pieces:
            name, _, weight = piece.rpartition(":") if ":" in piece else (piece, "", "1")
            if not name or not weight:
                raise ConfigError(f"{param('label')}: {piece!r:.60} is not LABEL or LABEL:WEIGHT; write a mix as "
                                  f"a:0.7,b:0.3")
            try:
                w = float(weight)
            except ValueError:
                raise ConfigError(f"{param('label')}: the weight of {name!r:.40} is {weight!r:.20}, not a number; "
                                  f"write a mix as a:0.7,b:0.3") from None
            if not (math.isfinite(w) and w > 0):
                raise ConfigError(f"{param('label')}: the weight of {name!r:.40} must be a positive number (weights "
                                  f"are normalised to sum 1), got {weight:.20}")
            if any(name == n for n, _ in parts):
                raise ConfigError(f"{param('label')} names {name!r:.40} twice; give each label once")
            parts.append((name, w))
        total = sum(w for _, w in parts)
        return cls(tuple((n, w / total) for n, w in parts))

    @property
    def names(self):
        return [n for n, _ in self.parts]

    @property
    def weights(self):
        return [w for _, w in self.parts]

    @property
    def single(self):
        return self.parts[0][0] if len(self.parts) == 1 else None


def _weighted(text):
    """Whether a lone --label value is NAME:NUMBER (one label with a weight) rather than a name that holds ':'."""
    name, colon, weight = text.rpartition(":")
    if not colon or not name:
        return False
    try:
        float(weight)
    except ValueError:
        return False
    return True


def check_decoding(s):
    """SampleSettings' beam search and label mix, checked together -> the LabelMix of --label (None without one)."""
    if s.beam is not None and not 1 <= s.beam <= MAX_BEAM:
        raise ConfigError(f"{param('beam')} must be from 1 to {MAX_BEAM} (1: greedy), got {s.beam}")
    if not 0 <= s.length_penalty <= MAX_ALPHA:
        raise ConfigError(f"{param('length_penalty')} must be from 0 to {MAX_ALPHA:g}, got {s.length_penalty}")
    if s.beam is not None and s.best_of is not None:
        raise ConfigError(f"{param('best_of')} ranks samples and {param('beam')} searches for the likeliest text; "
                          f"give one of them")
    pattern = next((n for n in ("regex", "grammar", "json_schema") if getattr(s, n) is not None), None)
    if s.beam is not None and pattern:  # its matcher's state cannot be forked when the beam reselects hypotheses
        raise ConfigError(f"{param('beam')} cannot search under {param(pattern)}; sample it instead (drop "
                          f"{param('beam')})")
    if s.beam is not None and s.suffix is not None:
        raise ConfigError(f"{param('beam')} does not fill in the middle ({param('suffix')}); sample the gap instead "
                          f"(drop {param('beam')})")
    mix = LabelMix.parse(s.label) if s.label else None
    if mix is not None and mix.single is None and s.guidance not in (None, 1.0):
        raise ConfigError(f"{param('guidance')} steers towards one label, not a mix; drop it, or give "
                          f"{param('label')} one name")
    return mix
