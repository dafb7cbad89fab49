"""A sampling call's options as one object, as transformers' GenerationConfig and llama2.c's Sampler are: how to
choose characters (config.SampleSettings, sample.py's flags), how many samples, the seed, the unknown-character
policy, the cache and best-of's copy span. It is made and checked once where a request comes in (sample.py's flags,
the playground's request model, an /interactive command, a Python call's keywords) and handed whole to the engine
(chargpt/sampling/engine.py), the constraints and the commands' writers (chargpt/cli/writers.py), which never check it
again.

    opts = SampleOptions.of(max_new_tokens=200, temperature=0.8, seed=1)   # a bad value: one-line ConfigError here
    gen.generate("ROMEO:", opts) == gen.generate("ROMEO:", max_new_tokens=200, temperature=0.8, seed=1)
    opts.replace(seed=2)                                                   # a new object, checked as it is made
"""

import difflib
from dataclasses import asdict, dataclass, field, fields, replace

from chargpt.config import MAX_INT, SampleSettings, check_seed
from chargpt.config.flags import param
from chargpt.errors import ConfigError

SETTINGS = tuple(f.name for f in fields(SampleSettings))


@dataclass(frozen=True)
class SampleOptions:
    """One sampling call's options; the fields beside `settings` are the Generator's (sample.py's --num-samples,
    --seed, --unknown, --no-cache, --min-span)."""
    settings: SampleSettings = field(default_factory=SampleSettings)  # checked when it was made
    num_samples: int = 1  # decoded together in one batch: the same seed and count give the same texts
    seed: int | None = None  # None: a random one for each call
    unknown: str = "error"  # prompt characters the model never saw: error, skip or replace (tokenizer.Vocab.encode)
    use_cache: bool = True  # False: the uncached reference decode (sampling.decode)
    min_span: int | None = None  # best-of's copy check (chargpt.tools.novelty); None: the run's default

    def __post_init__(self):
        if not isinstance(self.settings, SampleSettings):
            raise ConfigError(f"settings must be a SampleSettings, got {type(self.settings).__name__}")
        check_sample_options(self.num_samples, self.seed, self.settings.best_of, self.settings.beam)

    @classmethod
    def of(cls, **options):
        """Keywords (SampleSettings' fields and this class's) -> SampleOptions, checked once."""
        return cls().replace(**options)

    def replace(self, **overrides):
        """A copy with these keywords changed (SampleSettings' fields or this class's), checked as it is made; an
        unknown keyword is a ConfigError naming the closest option."""
        own = {f.name for f in fields(self)} - {"settings"}
        unknown = [k for k in overrides if k not in own and k not in SETTINGS]
        if unknown:
            close = difflib.get_close_matches(unknown[0], [*SETTINGS, *own], n=1)
            raise ConfigError(f"{unknown[0]!r:.40} is not a sampling option" + (f" (did you mean {close[0]}?)"
                              if close else f"; the options: {', '.join([*SETTINGS, *sorted(own)])}"))
        settings = {k: v for k, v in overrides.items() if k in SETTINGS}
        if settings:
            overrides = {**{k: v for k, v in overrides.items() if k in own},
                         "settings": replace(self.settings, **settings)}
        return replace(self, **overrides) if overrides else self

    def record(self):
        """What reproduces the text with the seed: every setting, the number of samples and the unknown-character
        policy (sample.py's --json `settings`)."""
        return {**asdict(self.settings), "num_samples": self.num_samples, "unknown": self.unknown}


def sample_options(options=None, **overrides):
    """A call's options: `options` as given (a SampleOptions, or a SampleSettings with the other options at their
    defaults; None: all defaults), with the keyword overrides applied, checked once here. What the Generator's entry
    points call, so that gen.generate(prompt, max_new_tokens=200, seed=1) and gen.generate(prompt, opts) agree."""
    if options is None:
        options = SampleOptions()
    elif isinstance(options, SampleSettings):
        options = SampleOptions(options)
    elif not isinstance(options, SampleOptions):
        raise ConfigError(f"options must be a SampleOptions (chargpt.sampling.options) or None, got "
                          f"{type(options).__name__}; give single settings as keywords (max_new_tokens=200)")
    return options.replace(**overrides) if overrides else options


def check_sample_options(num_samples, seed, best_of=None, beam=None):
    """The Generator options that are not SampleSettings: how many samples, and the seed (None: random); and that
    best_of or beam, if given (SampleSettings checks each alone), keeps no more samples than it writes."""
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or not 1 <= num_samples <= MAX_INT:
        raise ConfigError(f"{param('num_samples')} must be from 1 to 2**63 - 1, got {num_samples!r:.40}")
    if seed is not None:
        check_seed(seed)
    if best_of is not None and best_of < num_samples:
        raise ConfigError(f"{param('best_of')} ({best_of}) must be at least {param('num_samples')} ({num_samples}): "
                          f"best-of keeps the best num_samples of best_of samples")
    if beam is not None and beam < num_samples:
        raise ConfigError(f"{param('beam')} ({beam}) must be at least {param('num_samples')} ({num_samples}): the beam "
                          f"returns the best num_samples of the beam hypotheses it keeps")
