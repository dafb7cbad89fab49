"""The engine: a loaded model and its vocabulary, ready to write text or translate (chargpt.load -> Generator).

    import chargpt
    gen = chargpt.load("checkpoints/tinyshakespeare")
    print(gen.generate("ROMEO:", max_new_tokens=200, temperature=0.8, seed=1)[0])

It sits above the pure parts, as nanochat's engine.py and gpt-fast's generate.py do: chargpt/sampling.py
(next-character choice, the decode loop, stop strings) and chargpt/translate.py (the searches and scores).
"""

import torch

from .checkpoint import load_model, unwrap
from .config import SampleSettings, check_sample_options
from .errors import ChargptError
from .flags import param
from .model import CharGPT
from .pairs import END, SEP
from .quantize import check_precision, inference_model, uses_dynamic_int8
from .runtime import pick_decode_compile, pick_device
from .sampling import StepRunner, StopFilter, decode, through_filters
from .tokenizer import describe_chars
from .translate import iter_sample_search, make_steps, source_ids, translate


class Generator:
    """A loaded model and its vocabulary, ready to write text. Build it with chargpt.load(path).

    A model trained on sentence pairs (task 'pairs', either architecture) answers a prompt with its translation:
    the prompt is the source, and the text written is the target alone (see stream)."""

    def __init__(self, model, vocab, device, dtype=torch.float32, meta=None, compile="auto", quantized=False):
        # decode with the plain module: no DDP sync, no recompiles per length
        self.model, self.vocab, self.device, self.dtype = unwrap(model).eval(), vocab, torch.device(device), dtype
        self.meta = meta or {}
        self.task = self.meta.get("task", "text")
        self.precision = str(dtype).removeprefix("torch.")  # what the model computes in, in words (load says more)
        self.compile, self.quantized = compile, quantized  # --compile auto|on|off; torch's dynamic int8 modules?
        self.runner = None  # the compiled StepRunner, once one is asked for: compiled once and kept

    def decode_runner(self, new_chars):
        """-> (the StepRunner that decodes new_chars characters (all samples together) after the prefill, or None
        for the model's own forward with its growing cache; the choice in words). A decoder-only text model gets the
        compiled static step where --compile (runtime.pick_decode_compile) says it pays. Eager, the growing cache
        stays: it reads only the positions written so far, where the static step reads the whole window."""
        if not isinstance(self.model, CharGPT) or self.task == "pairs":
            return None, "decode step: the model's forward"
        compiled, reason = pick_decode_compile(self.compile, self.device, new_chars, self.quantized)
        if not compiled:
            return None, reason
        if self.runner is None:
            self.runner = StepRunner(self.model, compiled=True)  # compiled once, on its first call
        return self.runner, reason

    def describe(self):
        """The run in a few words, for the line a command prints when it loads one: its task, step, validation
        loss and vocabulary."""
        step, loss = self.meta.get("step"), self.meta.get("val_loss")
        facts = [f"step {step}"] if step is not None else []
        if self.task == "pairs":
            facts.insert(0, f"sentence pairs, {self.model.config.arch}")
        facts += [f"val loss {loss:.4f}"] if isinstance(loss, (int, float)) else []
        return ", ".join(facts + [f"{len(self.vocab)} characters"])

    def start_text(self):
        """What an empty prompt conditions on: a newline (as if a new paragraph started), else a space."""
        for c in ("\n", " "):
            if c in self.vocab.stoi:
                return c
        return self.vocab.chars[0]

    def prompt_text(self, prompt, unknown="error"):
        """The prompt as the model will see it after the unknown-character policy: 'error' raises naming
        each unknown character and its position, 'skip' drops them, 'replace' maps them to the first of
        U+FFFD, '?' or a space that the vocabulary has (else its first character)."""
        return self.vocab.decode(self.vocab.encode(prompt, unknown=unknown))

    def unknown_warning(self, prompt, unknown):
        """One line for stderr saying what 'skip' or 'replace' did to the prompt, or '' if nothing."""
        found = self.vocab.unknown(prompt)
        if not found or unknown == "error":
            return ""
        what = "dropped" if unknown == "skip" else f"replaced with {self.vocab.replacement()!r}"
        return f"{len(found)} prompt character(s) the model never saw were {what}: {describe_chars(found)}"

    def stream(self, prompt="", *, max_new_tokens=SampleSettings.max_new_tokens,
               temperature=SampleSettings.temperature, top_k=None, top_p=None, stop=(), num_samples=1, seed=None,
               unknown="error", use_cache=True):
        """Yield (sample index, text) pieces as they are decoded; the options are sample.py's flags. All
        samples decode together in one batch, so `seed` with the same `num_samples` reproduces them. For a
        pairs model the prompt is a source and the pieces are its translation (see _stream_pairs)."""
        settings = SampleSettings(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                                  stop=stop).validate()
        check_sample_options(num_samples, seed)
        prompt_seen = self.prompt_text(prompt, unknown)
        generator = torch.Generator()  # its own RNG: sampling never touches torch's global one
        if seed is None:
            generator.seed()
        else:
            generator.manual_seed(seed)
        if self.task == "pairs":
            yield from self._stream_pairs(prompt_seen, settings, num_samples, generator, use_cache)
            return
        ids = self.vocab.encode(prompt_seen or self.start_text())
        ctx = torch.tensor([ids] * num_samples, dtype=torch.long, device=self.device)  # (B, T)
        filters = [StopFilter(prompt_seen, settings.stop) for _ in range(num_samples)]
        runner = self.decode_runner(settings.max_new_tokens * num_samples)[0] if use_cache else None
        steps = decode(self.model, ctx, settings, generator, use_cache=use_cache, dtype=self.dtype, runner=runner)
        yield from through_filters(filters, ([(i, self.vocab.chars[c]) for i, c in enumerate(nxt.tolist())]
                                              for nxt in steps))

    def _stream_pairs(self, source, settings, num_samples, generator, use_cache):
        """A pairs model continues `source SEP` (or encodes the source) and stops at the end marker: the pieces are
        the target alone, decoded as `chargpt translate` does (its greedy or sampled search, one character per
        step), at most the context's worth or max_new_tokens."""
        if not source:
            raise ChargptError(f"this model was trained on sentence pairs: its prompt is the sentence to translate; "
                               f"give {param('prompt')} some text")
        ids = source_ids(self.model, self.vocab, [source], name="the prompt")
        step, room = make_steps(self.model, self.vocab, ids * num_samples, use_cache, self.dtype)
        filters = [StopFilter("", settings.stop) for _ in range(num_samples)]
        found = iter_sample_search(step, num_samples, self.vocab.stoi[END], min(room, settings.max_new_tokens),
                                   generator, settings.temperature, settings.top_k, settings.top_p)
        yield from through_filters(filters, ([(i, self.vocab.chars[tok].replace(SEP, "")) for i, tok in chosen]
                                              for chosen in (found if settings.max_new_tokens else ())))

    def translate(self, sources, **options):
        """Source strings -> their translations, for a pairs model; options as chargpt.translate.translate
        (beam, alpha, temperature, top_k, top_p, generator, unknown, batch_size, max_len, use_cache)."""
        if self.task != "pairs":
            raise ChargptError("this model was trained on plain text, not sentence pairs, so it does not translate; "
                               "write with it instead (sample.py), or train one with --task pairs")
        return translate(self.model, self.vocab, list(sources), dtype=self.dtype, **options)

    def generate(self, prompt="", **options):
        """-> list of the generated texts (prompt not included), one per sample. Options as for stream()."""
        out = [""] * options.get("num_samples", 1)
        for i, piece in self.stream(prompt, **options):
            out[i] += piece
        return out


def load(path, device="auto", dtype="auto", quantize=None, compile="auto"):
    """Checkpoint file or run directory -> Generator. dtype: auto (bf16 where the device computes it natively,
    else float32: runtime.pick_decode_dtype), float32 or bfloat16; quantize='int8': int8 weights for decoding on
    a CPU (chargpt.quantize); compile: auto|on|off, torch.compile of the decode step (auto: where it pays,
    runtime.pick_decode_compile)."""
    device = pick_device(device)
    check_precision(device, dtype, quantize)  # a bad choice fails before the checkpoint is read
    pick_decode_compile(compile, device, 0)  # so does a bad --compile
    model, vocab, meta = load_model(path, device)
    model, torch_dtype, precision = inference_model(model, device, dtype, quantize)
    gen = Generator(model, vocab, device, torch_dtype, meta, compile=compile, quantized=uses_dynamic_int8(model))
    gen.precision = precision
    return gen
