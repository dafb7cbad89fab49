"""Translating with a sentence-pairs model: greedy, sampled and beam-search decoding, and the scores.

The searches are pure functions over a step callback that hides the architecture:

    step(prev, rows) -> logits (N, V) of the next character for N hypotheses

where rows (N,) says which row of the previous call each hypothesis continues (a beam forks a row into several,
a finished row is dropped) and prev (N,) is the character each hypothesis just took. On the first call prev is
None and rows index the sources. DecoderSteps (CharGPT: prefill `source SEP`, then one position per step) and
EncoderDecoderSteps (encode once, keep the cross-attention keys and values, then one decoder position per step)
implement it with a KV cache, or without one as the reference.

    from chargpt.sampling.translate import translate
    translate(model, vocab, ["a sentence"], beam=4)   # -> ["its translation"]
"""

import torch

from chargpt.config.flags import param
from chargpt.data.pairs import END, SEP
from chargpt.data.tokenizer import describe_chars
from chargpt.errors import ChargptError
from chargpt.model.transformer import KVCache
from chargpt.runtime import autocast
from chargpt.sampling.decode import sample_next

CHRF_MISSING = "chrF needs sacrebleu: pip install 'chargpt[translate]' (exact match is reported without it)"


@torch.no_grad()
def sample_search(step, n, end_id, max_len, generator=None, temperature=0.0, top_k=None, top_p=None):
    """-> for each of n sources the ids it decodes up to END (not included), at most max_len steps. Each next
    character comes from chargpt.sampling.decode.sample_next: temperature 0 (the default) is greedy."""
    out = [[] for _ in range(n)]
    for pairs in iter_sample_search(step, n, end_id, max_len, generator, temperature, top_k, top_p):
        for i, tok in pairs:
            out[i].append(tok)
    return out


@torch.no_grad()
def iter_sample_search(step, n, end_id, max_len, generator=None, temperature=0.0, top_k=None, top_p=None):
    """sample_search one step at a time: yields [(source index, id)] for the sources still going (those that
    have just taken END are left out, and stop), so a caller can stream the characters as they come."""
    live = list(range(n))  # the source of each row
    logits = step(None, torch.arange(n))
    for t in range(max_len):
        nxt = sample_next(logits, generator, temperature, top_k, top_p).tolist()  # (N,)
        keep = [j for j, tok in enumerate(nxt) if tok != end_id]
        yield [(live[j], nxt[j]) for j in keep]
        if not keep or t + 1 == max_len:
            break
        live = [live[j] for j in keep]
        logits = step(torch.tensor([nxt[j] for j in keep]), torch.tensor(keep))


@torch.no_grad()
def beam_search(step, n, end_id, max_len, beam=4, alpha=1.0):
    """-> for each of n sources the best of `beam` hypotheses kept per step (ids, END not included); beam_hypotheses
    says how. Beam 1 is greedy."""
    return [found[0][1] if found else [] for found in beam_hypotheses(step, n, end_id, max_len, beam, alpha)]


@torch.no_grad()
def beam_hypotheses(step, n, end_id, max_len, beam=4, alpha=1.0, keep=1):
    """-> for each of n sources its `keep` best finished hypotheses, best first, as (score, ids, log-probability): the
    one search translation and text share (text: chargpt/sampling/beam.py, whose step gives every row an END column).

    A hypothesis that ends scores its log-probability / length ** alpha (length normalisation: without it,
    every extra character costs probability and short outputs win; END counts in the length). A source stops
    once it has `beam` finished hypotheses; at max_len the live ones count as finished. Beam 1 is greedy."""
    K = beam
    live = list(range(n))  # sources still searching; each owns K consecutive rows
    hyps = [[[] for _ in range(K)] for _ in live]  # per live source, per beam: ids so far
    scores = torch.full((n, K), float("-inf"))
    scores[:, 0] = 0.0  # a source's K rows start as one hypothesis (K copies of it would fill the beam)
    logp = torch.log_softmax(step(None, torch.arange(n).repeat_interleave(K)).float().cpu(), dim=-1)  # (n*K, V)
    finished = [[] for _ in range(n)]  # per source: (normalised score, ids, log-probability)
    for t in range(max_len):
        V = logp.size(-1)
        total = (scores[:, :, None] + logp.view(len(live), K, V)).view(len(live), K * V)
        top, idx = total.topk(min(2 * K, K * V), dim=-1)  # 2K: K left to go on after setting aside END ones
        next_live, next_hyps, next_scores, rows, toks = [], [], [], [], []
        for j, b in enumerate(live):
            cands = []  # (score, ids, row it continues, next id)
            for rank, (score, i) in enumerate(zip(top[j].tolist(), idx[j].tolist())):
                if score == float("-inf") or len(cands) == K:
                    break
                parent, tok = divmod(i, V)
                seq = hyps[j][parent]
                if tok == end_id:
                    if rank < K:  # only an END among the K best counts, as in fairseq
                        finished[b].append((score / (len(seq) + 1) ** alpha, seq, score))
                else:
                    cands.append((score, seq + [tok], j * K + parent, tok))
            if t + 1 == max_len:
                finished[b] += [(score / len(seq) ** alpha, seq, score) for score, seq, _, _ in cands
                                if score > float("-inf")]
            if len(finished[b]) >= K or t + 1 == max_len or not cands:
                continue
            cands += [(float("-inf"),) + cands[0][1:]] * (K - len(cands))  # pad a tiny vocabulary's beam
            next_live.append(b)
            next_hyps.append([c[1] for c in cands])
            next_scores.append([c[0] for c in cands])
            rows += [c[2] for c in cands]
            toks += [c[3] for c in cands]
        if not next_live:
            break
        live, hyps, scores = next_live, next_hyps, torch.tensor(next_scores)
        logp = torch.log_softmax(step(torch.tensor(toks), torch.tensor(rows)).float().cpu(), dim=-1)
    return [sorted(f, key=lambda x: -x[0])[:keep] for f in finished]


class DecoderSteps:
    """Step callback for CharGPT over prompts (n, P), each `source SEP`, all of one length P (the positions
    are absolute, so rows of one batch cannot be offset against each other)."""

    def __init__(self, model, prompts, use_cache=True, dtype=torch.float32):
        self.model, self.prompts, self.use_cache, self.dtype = model, prompts, use_cache, dtype
        self.device = prompts.device
        self.cache = self.seq = None  # (with a cache) keys/values so far; (without) the ids so far

    def __call__(self, prev, rows):
        rows = rows.to(self.device)
        with autocast(self.device, self.dtype):
            if not self.use_cache:  # the reference: the whole sequence every step
                self.seq = self.prompts[rows] if prev is None else torch.cat([self.seq[rows], self.column(prev)], 1)
                return self.model(self.seq)[0][:, -1]  # (N, V)
            if prev is None:  # prefill each prompt once, then fork its rows
                self.cache = KVCache(self.model.config, len(self.prompts), self.device, self.dtype)
                logits = self.model(self.prompts, cache=self.cache)[0][:, -1]
                self.cache.select(rows)
                return logits[rows]
            self.cache.select(rows)
            return self.model(self.column(prev), cache=self.cache)[0][:, -1]

    def column(self, prev):
        return prev.to(self.device)[:, None]  # (N, 1)


class EncoderDecoderSteps:
    """Step callback for EncoderDecoder over sources src (n, S) with their padding mask (n, S): the encoder
    runs once; the decoder starts from SEP (bos_id) and adds one position per step."""

    def __init__(self, model, src, src_mask, bos_id, use_cache=True, dtype=torch.float32):
        self.model, self.bos_id, self.use_cache, self.dtype = model, bos_id, use_cache, dtype
        self.device = src.device
        with autocast(self.device, dtype):
            self.memory = model.encode(src, src_mask)
        self.cache = self.seq = None

    def __call__(self, prev, rows):
        rows = rows.to(self.device)
        if len(rows) != self.memory.x.size(0) or not torch.equal(rows, torch.arange(len(rows), device=self.device)):
            self.memory = self.memory.select(rows)  # its cross-attention keys and values move with it
        if prev is None:
            self.seq = torch.full((len(rows), 1), self.bos_id, dtype=torch.long, device=self.device)
            if self.use_cache:
                self.cache = KVCache(self.model.config, len(rows), self.device, self.dtype)
        else:
            self.seq = torch.cat([self.seq[rows], prev.to(self.device)[:, None]], dim=1)  # (N, t)
            if self.use_cache:
                self.cache.select(rows)
        with autocast(self.device, self.dtype):
            tokens = self.seq[:, -1:] if self.use_cache else self.seq
            return self.model.decode(tokens, self.memory, self.cache)[:, -1]  # (N, V)


def _batches(lengths, batch_size, same_length):
    """Source indices in batches of up to batch_size, by length (similar lengths pad little)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batch = []
    for i in order:
        if batch and (len(batch) == batch_size or same_length and lengths[i] != lengths[batch[0]]):
            yield batch
            batch = []
        batch.append(i)
    if batch:
        yield batch


def source_limit(cfg):
    """The longest source a model translates: its context, less the separator for the decoder-only model (which
    needs room for `source SEP` and at least one target character)."""
    return cfg.block_size if cfg.arch == "encoder-decoder" else cfg.block_size - 1


def source_ids(model, vocab, sources, unknown="error", name="source {}"):
    """Source strings -> lists of ids, each checked: 1 to source_limit characters, no pair marker, characters the
    model never saw following `unknown` ('error' names them; 'skip', 'replace'). `name` formats a source's
    number (from 1) in messages: 'source {}', 'line {}', or a function of that number."""
    limit, out = source_limit(model.config), []
    for i, text in enumerate(sources):
        where = name(i + 1) if callable(name) else name.format(i + 1)
        found = vocab.unknown(text)
        if found and unknown == "error":
            raise ChargptError(f"{where} has {len(found)} character(s) the model never saw: {describe_chars(found)}; "
                               f"remove them, or pass {param('unknown', 'skip')} or {param('unknown', 'replace')}")
        if SEP in text or END in text:
            raise ChargptError(f"{where} contains U+{ord(SEP if SEP in text else END):04X}, a private-use "
                               f"character chargpt reserves as a pair marker; remove it")
        ids = vocab.encode(text, unknown=unknown)
        if not ids or len(ids) > limit:
            raise ChargptError(f"{where} has {len(ids)} characters; the model translates 1 to {limit} (its "
                               f"context): {'give it text' if not ids else 'split it into shorter pieces'}")
        out.append(ids)
    return out


def make_steps(model, vocab, ids, use_cache=True, dtype=torch.float32):
    """Sources (lists of ids: for the decoder-only model all of one length) -> (the step callback over them,
    the most characters each may decode within the context)."""
    device = next(model.parameters()).device
    longest = max(map(len, ids))
    rows = torch.tensor([s + [0] * (longest - len(s)) for s in ids], device=device)  # (n, S)
    sep = vocab.stoi[SEP]
    if model.config.arch == "encoder-decoder":
        lengths = torch.tensor([len(s) for s in ids], device=device)
        mask = torch.arange(longest, device=device)[None, :] < lengths[:, None]  # (n, S): not padding
        return EncoderDecoderSteps(model, rows, mask, sep, use_cache, dtype), model.config.block_size
    if any(len(s) != longest for s in ids):
        raise ValueError("the decoder-only model decodes sources of one length together")
    prompts = torch.cat([rows, rows.new_full((len(ids), 1), sep)], 1)  # (n, S + 1): source SEP
    return DecoderSteps(model, prompts, use_cache, dtype), model.config.block_size - longest


def check_translate_options(beam, alpha, temperature, top_k, top_p, batch_size):
    """`chargpt translate`'s search settings, checked before a model loads: a beam of 1 to 1000 (1: greedy) that
    does not sample, alpha from 0 to 10, and 1 to 1,000,000 sentences decoded together."""
    if not 1 <= beam <= 1000:
        raise ChargptError(f"--beam must be from 1 to 1000 (1: greedy), got {beam}")
    if not 0 <= alpha <= 10:  # also catches NaN
        raise ChargptError(f"--alpha must be from 0 to 10, got {alpha}")
    sampling = [name for name, given in (("--temperature", temperature > 0), ("--top-k", top_k is not None),
                                         ("--top-p", top_p is not None)) if given]
    if beam > 1 and sampling:
        raise ChargptError(f"--beam searches for the most likely translation and does not sample; drop "
                           f"{', '.join(sampling)}, or use --beam 1 to sample")
    if not 1 <= batch_size <= 1_000_000:
        raise ChargptError(f"--batch-size must be from 1 to 1000000, got {batch_size}")


@torch.no_grad()
def translate(model, vocab, sources, *, beam=1, alpha=1.0, temperature=0.0, top_k=None, top_p=None,
              generator=None, unknown="error", batch_size=64, max_len=None, use_cache=True, dtype=torch.float32,
              name="source {}", check_stop=None):
    """Source strings -> their translations (greedy by default; beam > 1: beam search; temperature > 0:
    sampling). Characters the model never saw follow `unknown` ('error', 'skip', 'replace') as in sampling.
    Sources decode in batches: for the decoder-only model, sources of one length together. max_len caps the
    characters of each translation (default: as many as the context holds). check_stop(), if given, is called
    before every decoding step (training's evaluation passes one that raises once a signal asks it to stop)."""
    ids = source_ids(model, vocab, sources, unknown, name)
    if temperature > 0 and generator is None:
        generator = torch.Generator().manual_seed(torch.seed())
    end = vocab.stoi[END]
    was_training = model.training
    model.eval()
    out = [None] * len(ids)
    try:
        for batch in _batches([len(s) for s in ids], batch_size, model.config.arch != "encoder-decoder"):
            step, steps = make_steps(model, vocab, [ids[i] for i in batch], use_cache, dtype)
            if check_stop is not None:
                step = _checked(step, check_stop)
            steps = min(steps, max_len or steps)
            if beam > 1:
                found = beam_search(step, len(batch), end, steps, beam, alpha)
            else:
                found = sample_search(step, len(batch), end, steps, generator, temperature, top_k, top_p)
            for i, f in zip(batch, found):
                out[i] = vocab.decode(f).replace(SEP, "")
    finally:
        model.train(was_training)
    return out


def _checked(step, check_stop):
    """The step callback, calling check_stop() before each step."""
    def checked(prev, rows):
        check_stop()
        return step(prev, rows)
    return checked


def exact_match(hyps, refs):
    """Fraction of hypotheses equal to their reference, character for character."""
    if len(hyps) != len(refs) or not refs:
        raise ValueError(f"need as many hypotheses as references, at least one (got {len(hyps)} and {len(refs)})")
    return sum(h == r for h, r in zip(hyps, refs)) / len(refs)


def chrf(hyps, refs):
    """Corpus chrF (character n-gram F-score, Popović 2015) from sacrebleu, 0 to 100; None when sacrebleu is
    not installed (show CHRF_MISSING once)."""
    try:
        from sacrebleu.metrics import CHRF
    except ImportError:
        return None
    return CHRF().corpus_score(list(hyps), [list(refs)]).score
