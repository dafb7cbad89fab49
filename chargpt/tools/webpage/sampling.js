/* How the exported page chooses what it writes (chargpt/sampling/ in JavaScript; decoder.js computes the logits):
choosing a character (decode.py's sample_next: temperature 0 is argmax, then top-k, softmax, top-p, and one uniform
draw mapped through the cumulative distribution; the draws come from mulberry32 seeded with the seed, so the same
seed gives the same text here, never torch's text), a call's options checked once (settings), stop strings
(StopFilter), and the constraints sample.py has: a form and an acrostic (chargpt/sampling/forms.py), banned and
allowed characters (chargpt/sampling/constraints.py), with the same semantics, character for character.

The named forms and the rules' characters (the longest free span, what ends a line, the escapes) are not written
here: the export puts forms.py's own table into the page's description ("forms"), and which vocabulary entries are
text characters (Python's str.isalpha, "letters": one 0/1 per id) beside it, so the page and sample.py cannot drift.

A form is compiled against the vocabulary (compile: every way it cannot be written is an Error before anything is
written) into a program of elements ("fixed", ids), ("slot"), ("free", ids of the fixed text that closes it, or
null), ("line"); a FormWalk follows one sample through it, naming before each character the mask rows that apply
(forms.py's FormWalk for one row). A Steer applies a call's constraints to the logits, in place, before each choice.
*/
"use strict";
(function (root, factory) {
  const api = factory();
  if (typeof module === "object" && module.exports) module.exports = api;  // node: the export's check, tests
  else root.chargptSampling = api;  // the page
})(typeof globalThis !== "undefined" ? globalThis : this, function () {
  // rows of a program's table before the fixed characters': anything allowed, a text character, a line end,
  // anything on the same line, nothing (forms.py's ANY, TEXT, LINE_END, SAME_LINE, NONE)
  const ANY = 0, TEXT = 1, LINE_END = 2, SAME_LINE = 3, NONE = 4, FIXED = 5;
  const MAX_OPTION_CHARS = 100000;  // form, acrostic, ban, allow, label, a stop string: bounded as every input

  function bad(message) { throw new Error(message); }
  const points = (s) => Array.from(s);  // by code point, as Python's str
  const has = (o, k) => Object.prototype.hasOwnProperty.call(o, k);
  const shown = (p) => p.replace(/\n/g, "\\n").replace(/\t/g, "\\t");
  const quoted = (c) => `${JSON.stringify(c)} (U+${c.codePointAt(0).toString(16).toUpperCase().padStart(4, "0")})`;

  // --- choosing characters --------------------------------------------------------------------------------------------
  /** mulberry32: a small, fast, well-mixed 32-bit generator; -> a function giving numbers in [0, 1). */
  function mulberry32(seed) {
    let a = (seed % 4294967296) ^ Math.imul(Math.floor(seed / 4294967296), 0x9e3779b1);  // seeds past 2**32 count
    return function () {
      a = (a + 0x6d2b79f5) | 0;
      let t = Math.imul(a ^ (a >>> 15), 1 | a);
      t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
      return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
    };
  }

  function argmax(logits) {
    let best = 0;
    for (let i = 1; i < logits.length; i++) if (logits[i] > logits[best]) best = i;  // the first of equals, as torch
    return best;
  }

  class Sampler {
    constructor(V) {
      this.p = new Float64Array(V); this.sorted = new Float64Array(V);
      this.order = Array.from({length: V}, (_, i) => i);  // reordered in place by top-p
    }

    /** logits -> the next id (chargpt/sampling/decode.py's sample_next); opts: temperature, topK, topP; rand() in [0, 1). */
    choose(logits, opts, rand) {
      const T = opts.temperature;
      if (!(T > 0)) return argmax(logits);
      const V = logits.length, p = this.p;
      let max = -Infinity;
      for (let i = 0; i < V; i++) if (logits[i] > max) max = logits[i];
      for (let i = 0; i < V; i++) p[i] = Math.fround(Math.fround(logits[i] - max) / T);
      if (opts.topK && opts.topK < V) {
        const s = this.sorted;
        s.set(p);
        s.sort();
        const kth = s[V - opts.topK];
        for (let i = 0; i < V; i++) if (p[i] < kth) p[i] = -Infinity;
      }
      let sum = 0;
      for (let i = 0; i < V; i++) { p[i] = Math.exp(p[i]); sum += p[i]; }
      for (let i = 0; i < V; i++) p[i] /= sum;
      if (opts.topP && opts.topP < 1) {
        const order = this.order;
        order.sort((a, b) => (p[b] - p[a]) || (a - b));  // most likely first; equals in id order (a stable sort)
        let before = 0;
        for (let j = 0; j < V; j++) {
          const i = order[j], q = p[i];
          if (before >= opts.topP) p[i] = 0;  // the mass before this one already reached top-p
          before += q;
        }
      }
      if (opts.minP) {  // less likely than minP times the most likely: dropped (transformers' MinPLogitsWarper)
        let most = 0;
        for (let i = 0; i < V; i++) if (p[i] > most) most = p[i];
        for (let i = 0; i < V; i++) if (p[i] < opts.minP * most) p[i] = 0;
      }
      let total = 0;
      for (let i = 0; i < V; i++) total += p[i];
      const u = rand() * total;  // the cumulative distribution scaled to end at total > u
      let cdf = 0;
      for (let i = 0; i < V; i++) {
        cdf += p[i];
        if (cdf > u && p[i] > 0) return i;
      }
      return argmax(p);  // rounding at the very end: the most likely
    }
  }

  // --- forms (chargpt/sampling/forms.py) ------------------------------------------------------------------------
  /** A form's value -> its pattern: a named shape's (or an alias's), or the value itself. */
  function resolve(form, rules) {
    const name = has(rules.aliases, form) ? rules.aliases[form] : form;
    return has(rules.shapes, name) ? rules.shapes[name][0] : form;
  }

  /** The name a form's value stands for (an alias resolved), or null for a pattern. */
  function shapeName(form, rules) {
    const name = has(rules.aliases, form) ? rules.aliases[form] : form;
    return has(rules.shapes, name) ? name : null;
  }

  /** A pattern (or shape name) -> items [kind, text]: ["fixed", text], ["slot", null] for _, ["free", null] for *. */
  function parse(form, rules) {
    const pattern = points(resolve(form, rules)), items = [];
    let fixed = "", i = 0;
    while (i < pattern.length) {
      const c = pattern[i];
      if (c === "\\") {
        if (i + 1 === pattern.length || !has(rules.escapes, pattern[i + 1])) {
          const after = i + 1 === pattern.length ? "its end" : JSON.stringify(pattern[i + 1]);
          bad(`form: a \\ before ${after} escapes nothing; \\_ \\* \\\\ \\n and \\t are the escapes`);
        }
        fixed += rules.escapes[pattern[i + 1]];
        i += 2;
        continue;
      }
      if (c === "_" || c === "*") {
        if (fixed) items.push(["fixed", fixed]);
        items.push([c === "_" ? "slot" : "free", null]);
        fixed = "";
      } else fixed += c;
      i++;
    }
    if (fixed) items.push(["fixed", fixed]);
    if (!items.some(([kind]) => kind !== "fixed")) {
      bad(`form ${JSON.stringify(shown(form).slice(0, 40))} is neither a named form (${Object.keys(rules.shapes).join(", ")}) ` +
          "nor a pattern (it has no _ or *)");
    }
    for (let k = 0; k + 1 < items.length; k++) {
      if (items[k][0] === "free" && items[k + 1][0] !== "fixed") {
        bad("form: a * must be followed by fixed text (it ends when the model writes that text) or end the form; " +
            "write \\* for the character *");
      }
    }
    return items;
  }

  const lastPoint = (text) => { const p = points(text); return p[p.length - 1]; };

  /** Indices of the items that start a line and can take an acrostic character (a _ or a *). */
  function lineStarts(items, rules) {
    const out = [];
    items.forEach(([kind], i) => {
      if (kind !== "fixed" && (i === 0 || (items[i - 1][0] === "fixed" &&
                                             rules.line_ends.includes(lastPoint(items[i - 1][1]))))) out.push(i);
    });
    return out;
  }

  function withAcrostic(items, chars, rules) {
    const starts = lineStarts(items, rules);
    if (chars.length > starts.length) {
      bad(`acrostic has ${chars.length} characters, but the form has only ${starts.length} line(s) that start with _ or *`);
    }
    const out = items.slice();
    for (let j = Math.min(chars.length, starts.length) - 1; j >= 0; j--) {
      const i = starts[j];
      out.splice(i, 1, ["fixed", chars[j]], ...(out[i][0] === "free" ? [out[i]] : []));
    }
    return out;
  }

  function acrosticItems(chars, atLineStart) {
    const items = atLineStart ? [] : [["line", null]];
    for (const c of chars) items.push(["fixed", c], ["line", null]);
    return items;
  }

  function checkChar(c, vocab, allowed, name, what) {
    if (!vocab.stoi.has(c)) bad(`${name}: ${what}'s character ${quoted(c)} is not in this model's vocabulary (it never saw it in training)`);
    if (!allowed[vocab.stoi.get(c)]) bad(`${name}: ${what} writes ${JSON.stringify(c)}, which ban or allow rules out`);
  }

  /** KMP's failure function of a free span's closing ids. */
  function failure(ids) {
    const fail = new Array(ids.length).fill(0);
    let k = 0;
    for (let j = 1; j < ids.length; j++) {
      while (k && ids[j] !== ids[k]) k = fail[k - 1];
      if (ids[j] === ids[k]) k++;
      fail[j] = k;
    }
    return fail;
  }

  /** form and acrostic -> a program for this vocabulary, or null for neither (forms.py's compile_form). vocab:
   * {chars, stoi (Map), letters (0/1 per id)}; allowed: 0/1 per id (what ban and allow leave); context: the text
   * before the sample. */
  function compile(form, acrostic, vocab, allowed, context, rules) {
    if (!form && !acrostic) return null;
    const acro = points(acrostic || "");
    for (const c of acro) checkChar(c, vocab, allowed, "acrostic", "the acrostic");
    const ctx = points(context || "");
    let items = form ? parse(form, rules) : acrosticItems(acro, !ctx.length || rules.line_ends.includes(ctx[ctx.length - 1]));
    if (form) {
      const seen = new Set();
      for (const [kind, text] of items) {
        if (kind !== "fixed") continue;
        for (const c of points(text)) if (!seen.has(c)) { seen.add(c); checkChar(c, vocab, allowed, "form", "the form"); }
      }
      items = withAcrostic(items, acro, rules);
    }
    const V = vocab.chars.length, text = new Uint8Array(V), ends = new Uint8Array(V), sameLine = new Uint8Array(V);
    let anyText = false, anyEnd = false, all = true;
    for (let i = 0; i < V; i++) {
      const c = vocab.chars[i];
      text[i] = vocab.letters[i] && allowed[i];
      ends[i] = rules.line_ends.includes(c) && allowed[i] ? 1 : 0;
      sameLine[i] = allowed[i] && !rules.line_breaks.includes(c) ? 1 : 0;
      anyText = anyText || text[i] === 1; anyEnd = anyEnd || ends[i] === 1; all = all && allowed[i] === 1;
    }
    if (items.some(([kind]) => kind === "slot") && !anyText) {
      bad("form has _ slots for letters or ideographs, but this model's vocabulary has none" +
          (all ? "" : " that ban and allow leave"));
    }
    if (items.some(([kind]) => kind === "line") && !anyEnd) {
      bad("acrostic without form starts lines, but this model's vocabulary has no line break (or full-width verse end) " +
          "it may write; give a form");
    }
    if (items[items.length - 1][0] === "free" && vocab.stoi.has("\n") && allowed[vocab.stoi.get("\n")]) {
      items = [...items, ["fixed", "\n"]];  // a * that ends the form ends with its line
    }
    const ids = (t) => points(t).map((c) => vocab.stoi.get(c));
    const fixedIds = [...new Set(items.filter(([k]) => k === "fixed").flatMap(([, t]) => ids(t)))].sort((a, b) => a - b);
    const fixedRow = new Map(fixedIds.map((id, k) => [id, FIXED + k]));
    const elements = items.map(([kind, t], k) => {
      if (kind === "fixed") return [kind, ids(t)];
      if (kind !== "free") return [kind, null];
      let closing = k + 1 < items.length ? items[k + 1][1] : "";  // up to its first line break, if any
      if (closing.includes("\n")) closing = closing.slice(0, closing.indexOf("\n") + 1);
      return [kind, closing ? ids(closing) : null];
    });
    const need = new Array(elements.length + 1).fill(0);
    for (let e = elements.length - 1; e >= 0; e--) {
      const [kind, x] = elements[e];
      need[e] = need[e + 1] + (kind === "fixed" ? x.length : kind === "free" ? 0 : 1);
    }
    const fail = new Map();
    elements.forEach(([kind, x], e) => { if (kind === "free" && x) fail.set(e, failure(x)); });
    let most = 0;  // a free span's closing part may be written over again: counted twice
    for (const [kind, x] of elements) {
      most += kind === "fixed" ? x.length : kind === "slot" ? 1 : rules.free_span + (x ? x.length : 0) + 1;
    }
    return {elements, table: [allowed, text, ends, sameLine, new Uint8Array(V)], fixedIds, fixedRow, need, fail, most,
            lineEnds: new Set(Array.from(ends.keys()).filter((i) => ends[i])), freeSpan: rules.free_span};
  }

  /** Where one sample is in a program (forms.py's FormWalk, for one row). */
  class FormWalk {
    constructor(program, budget) {
      this.p = program; this.budget = budget;  // characters still to be written, this one included
      this.e = 0; this.o = 0; this.n = 0; this.ended = false;  // element; offset or match; span length
    }

    /** -> [first, second]: the mask rows whose union this sample may write now. */
    masks() {
      const p = this.p, e = this.e;
      const [kind, ids] = e < p.elements.length ? p.elements[e] : [null, null];
      if (kind === "fixed") return [p.fixedRow.get(ids[this.o]), NONE];
      if (kind === "slot") return [TEXT, NONE];
      if ((kind === "free" || kind === "line") && (this.n >= p.freeSpan || this.budget - 1 < p.need[e]) &&
          (kind === "line" || ids)) {  // must end now: its closing part is written for it
        if (kind === "line") return [LINE_END, NONE];
        this.e = e + 1; this.n = 0;  // on into the fixed part, as far as the span already matched it
        return [p.fixedRow.get(p.elements[e + 1][1][this.o]), NONE];
      }
      if (kind === "free") return [SAME_LINE, ids ? p.fixedRow.get(ids[this.o]) : NONE];
      return [ANY, NONE];  // an acrostic's line, or past the form's end
    }

    /** Past the character c -> whether the form ended with it. */
    advance(c) {
      const p = this.p, e = this.e;
      if (this.ended) return false;
      const [kind, want] = p.elements[e];
      if (kind === "fixed") {
        this.o += 1;
        if (this.o === want.length) { this.e = e + 1; this.o = 0; }
      } else if (kind === "slot") {
        this.e += 1;
      } else if (kind === "line") {
        this.n += 1;
        if (p.lineEnds.has(c)) { this.e = e + 1; this.n = 0; }
      } else {
        this.n += 1;
        if (want === null) {  // a free span that ends the form: up to the longest span
          if (this.n >= p.freeSpan) this.e += 1;
        } else {
          const fail = p.fail.get(e);
          let k = this.o;
          while (k && want[k] !== c) k = fail[k - 1];
          if (want[k] === c) k++;
          this.o = k;
          if (k === want.length) {  // the model wrote the closing part itself: on with the rest of it, if any
            const rest = p.elements[e + 1][1].length > k;
            this.e = e + 1 + (rest ? 0 : 1); this.o = rest ? k : 0; this.n = 0;
          }
        }
      }
      this.budget -= 1;
      if (this.e >= p.elements.length) this.ended = true;
      return this.ended;
    }
  }

  // --- banned and allowed characters, and the call's plan (chargpt/sampling/constraints.py's plan) ------------------
  function charMask(vocab, chars) {
    const mask = new Uint8Array(vocab.chars.length);
    for (const c of chars) { const id = vocab.stoi.get(c); if (id !== undefined) mask[id] = 1; }
    return mask;
  }

  /** The checked options (settings) -> {allowed: 0/1 per id or null for all, program or null, penalty or null,
   * ngram or null}, or null when nothing constrains the sample. never: ids no sample may write (a labels run's label
   * characters). */
  function plan(o, vocab, context, rules, never) {
    const penalty = o.repetitionPenalty !== 1 ? o.repetitionPenalty : null, ngram = o.noRepeatNgram || null;
    if (!(o.ban || o.allow || o.form || o.acrostic || penalty || ngram)) return null;  // nothing given: as it was
    const V = vocab.chars.length;
    let allowed = new Uint8Array(V).fill(1);
    if (o.allow) allowed = charMask(vocab, o.allow);
    for (const id of never || []) allowed[id] = 0;
    if (o.allow && !allowed.includes(1)) bad("allow: none of its characters is in this model's vocabulary");
    if (o.ban) { const banned = charMask(vocab, o.ban); for (let i = 0; i < V; i++) if (banned[i]) allowed[i] = 0; }
    if (!allowed.includes(1)) bad("ban and allow leave no character this model knows");
    const program = compile(o.form, o.acrostic, vocab, allowed, context, rules);
    return {allowed: allowed.includes(0) ? allowed : null, program, penalty, ngram};
  }

  /** transformers' NoRepeatNGramLogitsProcessor as constraints.py's NgramBan, for one sample: a character that
   * would complete an n-gram already in the text (the context included) is banned. */
  class NgramBan {
    constructor(n, context) {
      this.n = n; this.length = context.length; this.seen = new Map();  // first n-1 ids (joined) -> the ids after
      for (let j = 0; j + n <= context.length; j++) this.note(context.slice(j, j + n - 1), context[j + n - 1]);
      this.tail = n > 1 ? context.slice(Math.max(0, context.length - n + 1)) : [];
    }

    note(key, id) {
      const k = key.join(",");
      if (!this.seen.has(k)) this.seen.set(k, new Set());
      this.seen.get(k).add(id);
    }

    banned() { return this.length + 1 < this.n ? null : this.seen.get(this.tail.join(",")) || null; }

    add(id) {
      if (this.tail.length === this.n - 1) this.note(this.tail, id);
      this.tail.push(id);
      if (this.tail.length > this.n - 1) this.tail.shift();
      this.length += 1;
    }
  }

  /** A plan applied to one sample of at most `budget` characters continuing the ids `context`: apply(logits)
   * penalises and masks them in place (-Infinity), as constraints.py's Steer.logits; chose(id) records the choice
   * -> whether the form ended with it; last, what the last apply allowed (null: everything). */
  class Steer {
    constructor(planned, budget, V, context) {
      this.allowed = planned.allowed; this.program = planned.program; this.penalty = planned.penalty;
      this.walk = planned.program ? new FormWalk(planned.program, budget) : null;
      this.ngrams = planned.ngram ? new NgramBan(planned.ngram, context) : null;
      this.seen = planned.penalty ? new Uint8Array(V) : null;  // the characters in the text so far, context included
      if (this.seen) for (const id of context) this.seen[id] = 1;
      this.mask = new Uint8Array(V); this.hard = new Uint8Array(V);
    }

    apply(logits) {
      let mask = this.allowed;
      if (this.walk) {
        const [first, second] = this.walk.masks(), m = this.mask;
        m.fill(0);
        for (const row of [first, second]) {
          if (row >= FIXED) m[this.program.fixedIds[row - FIXED]] = 1;
          else if (row !== NONE) { const t = this.program.table[row]; for (let i = 0; i < m.length; i++) m[i] |= t[i]; }
        }
        mask = m;
      }
      const banned = this.ngrams && this.ngrams.banned();
      if (banned && banned.size) {
        const hard = this.hard;
        if (mask) hard.set(mask); else hard.fill(1);
        for (const id of banned) hard[id] = 0;
        if (hard.includes(1)) mask = hard;  // a sample left with nothing (the form's fixed character): the form wins
        else if (!mask) { mask = this.mask; mask.fill(1); }
      }
      if (this.seen) {  // transformers' repetition_penalty, in float32
        const p = this.penalty;
        for (let i = 0; i < logits.length; i++) {
          if (this.seen[i]) logits[i] = logits[i] < 0 ? Math.fround(logits[i] * p) : Math.fround(logits[i] / p);
        }
      }
      if (mask) for (let i = 0; i < logits.length; i++) if (!mask[i]) logits[i] = -Infinity;
      this.last = mask;
      return logits;
    }

    chose(id) {
      if (this.seen) this.seen[id] = 1;
      if (this.ngrams) this.ngrams.add(id);
      return this.walk ? this.walk.advance(id) : false;
    }
  }

  // --- stop strings --------------------------------------------------------------------------------------------------
  /** Cuts a text at the first stop string it writes (chargpt/sampling/decode.py's StopFilter): text is released once it
   * can no longer be the start of one; a stop string may begin in the prompt but must end in new text. */
  class StopFilter {
    constructor(prompt, stops) {
      this.stops = stops.filter((s) => s.length > 0);
      this.hold = Math.max(1, ...this.stops.map((s) => s.length)) - 1;
      this.before = this.hold ? prompt.slice(-this.hold) : "";
      this.pending = ""; this.done = false;
    }

    feed(chars) {
      if (this.done) return "";
      const checked = this.pending.length;
      this.pending += chars;
      const window = this.before + this.pending;
      let first = null;  // [end, start] in window
      for (const s of this.stops) {
        const i = window.indexOf(s, Math.max(0, this.before.length + checked + 1 - s.length));
        if (i >= 0 && (first === null || i + s.length < first[0] || (i + s.length === first[0] && i < first[1]))) {
          first = [i + s.length, i];
        }
      }
      if (first !== null) {
        this.done = true;
        const out = this.pending.slice(0, Math.max(0, first[1] - this.before.length));
        this.pending = "";
        return out;
      }
      const release = this.pending.length - this.hold;
      if (release <= 0) return "";
      const out = this.pending.slice(0, release);
      this.pending = this.pending.slice(release);
      this.before = this.hold ? (this.before + out).slice(-this.hold) : "";
      return out;
    }

    flush() { const out = this.pending; this.pending = ""; return out; }

    /** The sample ends here (its form is complete): -> the text still held back. */
    end() { const out = this.done ? "" : this.flush(); this.done = true; return out; }
  }

  // --- a call's options ----------------------------------------------------------------------------------------------
  const OPTIONS = ["maxNewTokens", "temperature", "topK", "topP", "minP", "seed", "stop", "stopAtBlankLine", "unknown",
                   "signal", "form", "acrostic", "ban", "allow", "repetitionPenalty", "noRepeatNgram", "label", "guidance"];
  const typeOf = (v) => (v === null ? "null" : Array.isArray(v) ? "an array" : `a ${typeof v}`);

  /** The options with their defaults, checked: -> a plain object; a bad one is an Error naming it and the fix. */
  function settings(opts, defaults) {
    if (opts === undefined || opts === null) opts = {};
    if (typeof opts !== "object" || Array.isArray(opts)) {
      bad(`the options must be an object such as {maxNewTokens: 200, temperature: 0.8}, not ${typeOf(opts)}`);
    }
    const unknown = Object.keys(opts).find((k) => !OPTIONS.includes(k));
    if (unknown !== undefined) bad(`${JSON.stringify(unknown).slice(0, 40)} is not an option; the options: ${OPTIONS.join(", ")}`);
    const d = defaults || {};
    const given = (name) => opts[name] !== undefined && opts[name] !== null;
    const num = (name, fallback) => (given(name) ? Number(opts[name]) : fallback);
    const text = (name) => {
      if (!given(name)) return null;
      if (typeof opts[name] !== "string") bad(`${name} must be a string, not ${typeOf(opts[name])}`);
      if (opts[name].length > MAX_OPTION_CHARS) bad(`${name} is longer than ${MAX_OPTION_CHARS} characters; shorten it`);
      return opts[name];
    };
    let stop = given("stop") ? opts.stop : [];
    if (typeof stop === "string") stop = [stop];  // one stop string, not one per character (as sample.py)
    if (!Array.isArray(stop) || stop.some((s) => typeof s !== "string" || !s || s.length > MAX_OPTION_CHARS)) {
      bad("stop must be a list of non-empty strings, such as [\"\\n\\n\"]");
    }
    const o = {
      maxNewTokens: num("maxNewTokens", d.max_new_tokens || 500), temperature: num("temperature", d.temperature),
      topK: num("topK", 0), topP: num("topP", 1), unknown: given("unknown") ? opts.unknown : "error",
      signal: given("signal") ? opts.signal : null, seed: num("seed", Math.floor(Math.random() * 4294967296)),
      stop: [...stop, ...(opts.stopAtBlankLine ? ["\n\n"] : [])],
      form: text("form"), acrostic: text("acrostic"), ban: text("ban"), allow: text("allow"), label: text("label"),
      guidance: num("guidance", d.guidance || 1), minP: num("minP", 0), repetitionPenalty: num("repetitionPenalty", 1),
      noRepeatNgram: num("noRepeatNgram", 0),
    };
    if (!(Number.isInteger(o.maxNewTokens) && o.maxNewTokens >= 0 && o.maxNewTokens <= 1e6)) bad("maxNewTokens must be a whole number from 0 to 1000000");
    if (!(o.temperature >= 0 && o.temperature <= 100)) bad("temperature must be from 0 (greedy) to 100");
    if (!(Number.isInteger(o.topK) && o.topK >= 0)) bad("topK must be a whole number, 0 for off");
    if (!(o.topP > 0 && o.topP <= 1)) bad("topP must be in (0, 1], 1 for off");
    if (!(o.minP >= 0 && o.minP <= 1)) bad("minP must be in [0, 1], 0 for off");
    if (!(o.repetitionPenalty >= 1e-6 && o.repetitionPenalty <= 1e6)) bad("repetitionPenalty must be from 1e-6 to 1000000, 1 for off");
    if (!(Number.isInteger(o.noRepeatNgram) && o.noRepeatNgram >= 0 && o.noRepeatNgram <= 1000)) bad("noRepeatNgram must be a whole number from 0 (off) to 1000");
    if (!(Number.isInteger(o.seed) && o.seed >= 0 && o.seed <= Number.MAX_SAFE_INTEGER)) bad("seed must be a whole number from 0 to 2**53 - 1");
    if (!["error", "skip", "replace"].includes(o.unknown)) bad("unknown must be error, skip or replace");
    if (!(o.guidance >= 1 && o.guidance <= 1e6)) bad("guidance must be from 1 (plain label) to 1000000");
    if (o.guidance !== 1 && !o.label) bad("guidance steers towards a label: give label too, or guidance 1");
    if (o.signal !== null && typeof o.signal.aborted !== "boolean") bad("signal must be an AbortSignal (new AbortController().signal)");
    return o;
  }

  return {mulberry32, argmax, Sampler, resolve, shapeName, parse, compile, FormWalk, plan, NgramBan, Steer, StopFilter, settings, OPTIONS};
});
