"""The requests the API takes, declared as pydantic models (as FastAPI declares them): each field's type, its
default and this server's limit on it (chargpt/web/limits.py). Strict: a bool is not a number, a float is not an
integer, a number is not a string, and an unknown field is refused. A body that does not fit is one 400 line naming
the field and what it must be (one_line). The sampling settings' own rules (temperature >= 0, top_p in (0, 1], a
non-empty stop string, the seed's range) are chargpt.config's: GenerateRequest becomes the engine's one options
object (chargpt.sampling.options.SampleOptions) as it is parsed, checked there by config's rules, whose message is the
400."""

import contextvars
import json
from typing import Annotated, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from chargpt.config import SampleSettings
from chargpt.data.tokenizer import UNKNOWN_POLICIES
from chargpt.errors import ConfigError
from chargpt.sampling.options import SETTINGS, SampleOptions
from chargpt.sampling.suggest import MAX_K, MAX_WORDS
from chargpt.web.body import RequestError
from chargpt.web.limits import (
    MAX_BEAM,
    MAX_GUIDANCE,
    MAX_INSIDE_CHARS,
    MAX_LABEL_CHARS,
    MAX_NEW_CHARS,
    MAX_NOVELTY_CHARS,
    MAX_PROMPT_CHARS,
    MAX_SAMPLES,
    MAX_STOP_CHARS,
    MAX_STOPS,
    MAX_TEMPERATURE,
    MAX_TOP,
    MAX_TOP_K,
)


class Request(BaseModel):
    """A JSON request body's fields."""
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    @classmethod
    def parse(cls, body):
        """A parsed JSON object -> the request, or a RequestError(400) in one line."""
        try:
            return cls.model_validate(body)
        except ValidationError as e:
            raise RequestError(400, one_line(cls, e.errors())) from None


class GenerateRequest(Request):
    """/api/generate's body: SampleSettings' fields by the same names (with this server's limits), and the other
    options (num_samples, seed, unknown, min_span); the run and the prompt."""
    run: str
    prompt: str = Field("", max_length=MAX_PROMPT_CHARS)
    max_new_tokens: int = Field(SampleSettings.max_new_tokens, le=MAX_NEW_CHARS)
    temperature: float = Field(SampleSettings.temperature, le=MAX_TEMPERATURE)
    top_k: int | None = Field(None, le=MAX_TOP_K)
    top_p: float | None = None
    num_samples: int = Field(1, ge=1, le=MAX_SAMPLES)
    seed: int | None = None  # None: a random one, reported in the `start` event
    unknown: Literal[UNKNOWN_POLICIES] = "error"
    stop: list[Annotated[str, Field(max_length=MAX_STOP_CHARS)]] = Field(
        [], max_length=MAX_STOPS, description=f"a list of at most {MAX_STOPS} strings of at most {MAX_STOP_CHARS} "
                                              f"characters")
    # the constraints (chargpt/sampling/constraints.py, chargpt/sampling/forms.py); best_of decodes its samples in one
    # batch
    form: str | None = Field(None, max_length=MAX_PROMPT_CHARS)
    acrostic: str | None = Field(None, max_length=MAX_PROMPT_CHARS)
    ban: str | None = Field(None, max_length=MAX_PROMPT_CHARS)
    allow: str | None = Field(None, max_length=MAX_PROMPT_CHARS)
    best_of: int | None = Field(None, le=MAX_SAMPLES)
    repetition_penalty: float | None = None
    no_repeat_ngram: int | None = Field(None, le=MAX_NEW_CHARS)
    min_p: float | None = None
    # a pattern (chargpt/sampling/grammar.py), one at a time: a regular expression, a Lark grammar's text, a JSON
    # schema (an object, or its text); the body's limit bounds the schema
    regex: str | None = Field(None, max_length=MAX_PROMPT_CHARS)
    grammar: str | None = Field(None, max_length=MAX_PROMPT_CHARS)
    json_schema: dict | str | None = None
    min_span: int | None = Field(None, ge=1, le=MAX_NOVELTY_CHARS)  # best-of's copy check; None: the run's default
    # a run trained with --labels (chargpt/data/labels.py): write in this label's style (None: unconditioned), held to
    # it by classifier-free guidance >= 1; a label the run does not have is a 400 once the run is loaded (write.start)
    label: str | None = Field(None, max_length=MAX_LABEL_CHARS)
    guidance: float | None = Field(None, le=MAX_GUIDANCE)
    # beam search (chargpt/sampling/beam.py): the likeliest text, num_samples of the beam's best; this server's width
    beam: int | None = Field(None, le=MAX_BEAM)
    length_penalty: float = SampleSettings.length_penalty
    # fill in the middle: a run trained with --fim (chargpt/sampling/infill.py) writes what goes between the prompt
    # and this text; a run without is a one-line 400 when it decodes (write.start)
    suffix: str | None = Field(None, max_length=MAX_PROMPT_CHARS)

    _options: SampleOptions | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _sampling_rules(self):
        """The request as SampleOptions, made once here and so checked by config's rules, as sample.py's flags are.
        Made in a fresh context, where config names a setting as the JSON field (`temperature`), not as a flag:
        `chargpt serve` runs the server inside config.cli_names."""
        try:
            self._options = contextvars.Context().run(self._make_options)
        except ConfigError as e:
            raise ValueError(str(e)) from None
        return self

    def _make_options(self):
        settings = SampleSettings(**{**{name: getattr(self, name) for name in SETTINGS}, "stop": tuple(self.stop)})
        return SampleOptions(settings, num_samples=self.num_samples, seed=self.seed, unknown=self.unknown,
                             min_span=self.min_span)

    def options(self):
        """The request's SampleOptions (its seed None when none was given), made when the request was parsed."""
        return self._options


class InsideRequest(Request):
    run: str
    text: str = Field(min_length=1, max_length=MAX_INSIDE_CHARS)
    top: int = Field(5, ge=1, le=MAX_TOP)
    end: int | None = None  # the attention window ends before this position; None: at the text's end

    @model_validator(mode="after")
    def _end_in_text(self):
        if self.end is not None and not 1 <= self.end <= len(self.text):
            raise ValueError(f"end must be between 1 and {len(self.text)}, got {self.end}")
        return self


class NoveltyRequest(Request):
    run: str
    text: str = Field(max_length=MAX_NOVELTY_CHARS)
    min_span: int | None = Field(None, ge=1, le=MAX_NOVELTY_CHARS)  # None: chargpt.tools.novelty's default


class SuggestRequest(Request):
    """/api/suggest's body: the text typed so far, and how many next characters (k) and word completions to list."""
    run: str
    text: str = Field("", max_length=MAX_PROMPT_CHARS)
    k: int = Field(5, ge=1, le=MAX_K)
    words: int = Field(3, ge=0, le=MAX_WORDS)
    unknown: Literal[UNKNOWN_POLICIES] = "error"
    label: str | None = Field(None, max_length=MAX_LABEL_CHARS)


class StopRequest(Request):
    id: str


# --- pydantic's errors as one line ------------------------------------------------------------------------------
TYPE_WORDS = {"string_type": "a string", "int_type": "an integer", "float_type": "a number", "list_type": "a list"}


def one_line(model, errors):
    """pydantic's errors -> one line that names the field and what it must be: the unknown fields (a misspelt
    name), else the first field that does not fit."""
    unknown = [str(e["loc"][0]) for e in errors if e["type"] == "extra_forbidden"]
    if unknown:
        return f"unknown field(s) {', '.join(unknown)[:200]}; allowed: {', '.join(model.model_fields)}"
    error = errors[0]
    if error["type"] == "value_error":  # a model's own check, already one line
        return str(error["ctx"]["error"])
    name, kind, value = error["loc"][0], error["type"], error.get("input")
    field = model.model_fields[name]
    if kind == "missing":
        return f"{name} is required"
    if field.description:  # a field whose whole rule is said at once (a list and its items)
        return f"{name} must be {field.description}, got {_shown(value)}"
    if kind in TYPE_WORDS:
        nullable = type(None) in get_args(field.annotation)
        return f"{name} must be {TYPE_WORDS[kind]}{' or null' if nullable else ''}, got {_shown(value)}"
    if kind == "literal_error":
        return f"{name} must be one of {', '.join(get_args(field.annotation))}, got {value!r:.40}"
    if kind in ("greater_than_equal", "less_than_equal"):
        low, high = _bound(field, "ge"), _bound(field, "le")
        rule = f"between {low} and {high}" if low is not None and high is not None else \
            f"at least {low}" if low is not None else f"at most {high}"
        return f"{name} must be {rule}, got {value}"
    if kind in ("string_too_short", "string_too_long"):
        shortest, longest = _bound(field, "min_length"), _bound(field, "max_length")
        if shortest is not None:
            return f"{name} must have {shortest} to {longest} characters, got {len(value)}"
        return f"{name} is {len(value)} characters; the limit is {longest}"
    return f"{name}: {error['msg']}"


def _bound(field, name):
    """A field's declared bound (ge, le, min_length or max_length, as given to Field), or None."""
    return next((getattr(m, name) for m in field.metadata if hasattr(m, name)), None)


def _shown(value):
    return json.dumps(value)[:40]
