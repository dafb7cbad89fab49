/* chargpt's decoder in JavaScript: the exported page writes with it, and `chargpt export --format web` runs the same
file under node to check a page before writing it (chargpt/tools/webpage/check.js).

It computes what chargpt/model/transformer.py's CharGPT computes at inference, with a KV cache (a prompt, or a window being rebuilt,
goes through in one pass that reads each weight once; then one position at a time): token +
position embeddings (the position table is stored whole: learned, or chargpt's sinusoidal table), n_layer blocks
(pre-LN: x + attn(ln_1(x)), x + mlp(ln_2(x)); post-LN: ln_1(x + attn(x)), ln_2(x + mlp(x))), causal multi-head
self-attention, a GELU (exact, erf) or ReLU MLP, the final LayerNorm (pre-LN only) and the head. Activations are kept
in Float32Array buffers, so every stored value is rounded to float32 as torch's are; the matrix products run in
WebAssembly SIMD where it runs (float32 sums, four lanes; see useSimd), else in the JavaScript loops below (sums in
double, which only makes them closer to exact). The weights are float32, or int8 with one float32 scale per row (an output row of a
Linear layer, a token or position of an embedding): a row's dot product is taken over its int8 values, then scaled.

Long texts slide the window as chargpt/sampling/decode.py's decode() does: when the context is full, the cache is rebuilt
from the last 3/4 of block_size characters, and decoding goes on. A run trained with --labels keeps its label first in
the window, and guidance computes a second row (the same text after the NULL label) in a second cache, as decode()'s
batch of two halves. Choosing a character (sample_next()), the options, stop strings and the constraints (a form, an
acrostic, banned and allowed characters) are sampling.js's, the page's script before this one.

Nothing here allocates per character: the buffers are made once for the model. Matrices are row-major (torch's
(out, in)), so a matrix-vector product is one dot product per row over contiguous memory.
*/
"use strict";
(function (root, factory) {
  // sampling.js runs first: the page's global, or (the export's check) the argument its loader names
  const api = factory(typeof chargptSampling !== "undefined" ? chargptSampling : root.chargptSampling);
  if (typeof module === "object" && module.exports) module.exports = api;  // node: the export's check, tests
  else root.chargptDecoder = api;  // the page
})(typeof globalThis !== "undefined" ? globalThis : this, function (C) {
  const LITTLE_ENDIAN = new Uint8Array(new Uint32Array([1]).buffer)[0] === 1;
  const TWO_OVER_SQRT_PI = 1.1283791670955126;

  /** base64 text -> Uint8Array (its own buffer, at offset 0: the weights' views need their alignment). */
  function base64Bytes(text) {
    if (typeof Buffer === "function") return new Uint8Array(Buffer.from(text, "base64"));  // node: native, fast
    const bin = atob(text);
    const out = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  }

  /** The error function to double precision where it matters for float32: its Maclaurin series below 2.5, the
   * continued fraction of erfc above (JavaScript has no Math.erf). */
  const INV = Float64Array.from({length: 80}, (_, n) => 1 / n), INV_ODD = INV.map((_, n) => 1 / (2 * n + 1));
  function erf(z) {
    const a = Math.abs(z);
    if (a >= 6) return z > 0 ? 1 : -1;
    if (a < 2.5) {
      const z2 = z * z;
      let term = z, sum = z;
      for (let n = 1; n < 80; n++) {
        term *= -z2 * INV[n];
        const add = term * INV_ODD[n];
        sum += add;
        if (Math.abs(add) < 1e-17 * Math.abs(sum)) break;
      }
      return sum * TWO_OVER_SQRT_PI;
    }
    let f = a;  // erfc(a) = exp(-a^2) / sqrt(pi) / (a + (1/2) / (a + 1 / (a + (3/2) / (a + ...))))
    for (let k = 60; k >= 1; k--) f = a + (k / 2) / f;
    const erfc = Math.exp(-a * a) / (Math.sqrt(Math.PI) * f);
    return z > 0 ? 1 - erfc : erfc - 1;
  }

  // --- the weights ------------------------------------------------------------------------------------------------
  function tensor(meta, bytes, name) {
    const t = meta.tensors[name];
    if (!t) return null;
    const rows = t.shape.length === 2 ? t.shape[0] : 1, cols = t.shape[t.shape.length - 1];
    const at = (offset, Type, n) => new Type(bytes.buffer, bytes.byteOffset + offset, n);
    if (t.dtype === "int8") return {rows, cols, q: at(t.offset, Int8Array, rows * cols), scale: at(t.scale, Float32Array, rows)};
    return {rows, cols, w: at(t.offset, Float32Array, rows * cols)};
  }

  /** Row r of a matrix (an embedding), times `times`, added into out at `at` (out holds zeros or the token). */
  function addRow(m, r, out, at, times) {
    const base = r * m.cols;
    if (m.w) for (let i = 0; i < m.cols; i++) out[at + i] += m.w[base + i] * times;
    else {
      const s = m.scale[r] * times;
      for (let i = 0; i < m.cols; i++) out[at + i] += m.q[base + i] * s;
    }
  }

  // out (T x rows) = x (T x n) W^T (+ bias): torch's nn.Linear over T positions. Each weight row is read once for
  // all T (a prefill reads the weights once, not once per position); one dot product per row and position. Two
  // functions, not one: each loop then reads one kind of typed array, which V8 compiles tightly.
  function matmulF32(w, rows, n, x, T, out, bias) {
    const n4 = n - (n % 4);
    for (let r = 0; r < rows; r++) {
      const base = r * n, b = bias ? bias[r] : 0;
      for (let t = 0; t < T; t++) {
        const xo = t * n;
        let s0 = 0, s1 = 0, s2 = 0, s3 = 0, i = 0;
        for (; i < n4; i += 4) {
          s0 += w[base + i] * x[xo + i];
          s1 += w[base + i + 1] * x[xo + i + 1];
          s2 += w[base + i + 2] * x[xo + i + 2];
          s3 += w[base + i + 3] * x[xo + i + 3];
        }
        for (; i < n; i++) s0 += w[base + i] * x[xo + i];
        out[t * rows + r] = (s0 + s1) + (s2 + s3) + b;
      }
    }
  }

  function matmulI8(q, scale, rows, n, x, T, out, bias) {
    const n4 = n - (n % 4);
    for (let r = 0; r < rows; r++) {
      const base = r * n, b = bias ? bias[r] : 0, s = scale[r];
      for (let t = 0; t < T; t++) {
        const xo = t * n;
        let s0 = 0, s1 = 0, s2 = 0, s3 = 0, i = 0;
        for (; i < n4; i += 4) {
          s0 += q[base + i] * x[xo + i];
          s1 += q[base + i + 1] * x[xo + i + 1];
          s2 += q[base + i + 2] * x[xo + i + 2];
          s3 += q[base + i + 3] * x[xo + i + 3];
        }
        for (; i < n; i++) s0 += q[base + i] * x[xo + i];
        out[t * rows + r] = ((s0 + s1) + (s2 + s3)) * s + b;
      }
    }
  }

  function linear(m, x, T, out, bias) {
    if (m.simd) m.simd(x, T, out, bias);
    else if (m.w) matmulF32(m.w, m.rows, m.cols, x, T, out, bias);
    else matmulI8(m.q, m.scale, m.rows, m.cols, x, T, out, bias);
  }

  // --- WebAssembly SIMD: the same products, four lanes at a time --------------------------------------------------
  // Where the browser (or node) runs WebAssembly SIMD, the matrices are copied into one WebAssembly memory, int8 ones
  // dequantized (each value times its row's scale, as the export's int8 reference computes), and every product
  // goes through matvec below: about 17x the plain JavaScript loops above on a 2-core Xeon (4.2 against 0.24 G
  // multiply-adds a second), which is what makes a 6 x 384 model write faster than one reads. Its sums are float32,
  // four lanes added pairwise at the end; the export's check holds them to chargpt's logits as it does the loops.
  // The module, 198 bytes, is written out by hand (no toolchain): matvec(w, x, out, rows, n), byte addresses into
  // the memory "env.mem", for r < rows: out[r] = sum over i < n (n a multiple of 4) of w[r * n + i] * x[i].
  const MATVEC_WASM = new Uint8Array([
    0, 97, 115, 109, 1, 0, 0, 0, 1, 9, 1, 96, 5, 127, 127, 127, 127, 127, 0, 2, 12, 1, 3, 101, 110, 118, 3, 109,
    101, 109, 2, 0, 1, 3, 2, 1, 0, 7, 10, 1, 6, 109, 97, 116, 118, 101, 99, 0, 0, 10, 146, 1, 1, 143, 1, 2, 2,
    127, 1, 123, 2, 64, 3, 64, 32, 5, 32, 3, 79, 13, 1, 253, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    33, 7, 65, 0, 33, 6, 2, 64, 3, 64, 32, 6, 32, 4, 79, 13, 1, 32, 7, 32, 0, 253, 0, 2, 0, 32, 1, 32, 6, 65, 2,
    116, 106, 253, 0, 2, 0, 253, 230, 1, 253, 228, 1, 33, 7, 32, 0, 65, 16, 106, 33, 0, 32, 6, 65, 4, 106, 33,
    6, 12, 0, 11, 11, 32, 2, 32, 5, 65, 2, 116, 106, 32, 7, 253, 31, 0, 32, 7, 253, 31, 1, 146, 32, 7, 253, 31,
    2, 32, 7, 253, 31, 3, 146, 146, 56, 2, 0, 32, 5, 65, 1, 106, 33, 5, 12, 0, 11, 11, 11
  ]);

  /** Give the model's matrices the SIMD product (m.simd) where WebAssembly SIMD runs and memory allows; -> whether. */
  function useSimd(model) {
    const seen = new Set(), mats = [model.head];
    if (model.ada) mats.push(model.ada.head, ...model.ada.tails.flatMap((tail) => [tail.proj, tail.out]));
    for (const L of model.layers) mats.push(L.attn, L.proj, L.fc, L.out);
    const todo = mats.filter((m) => m && m.cols % 4 === 0 && !seen.has(m) && seen.add(m));
    if (!todo.length || typeof WebAssembly !== "object" || !WebAssembly.validate(MATVEC_WASM)) return false;
    let floats = 0;
    for (const m of todo) floats += m.rows * m.cols;
    const maxCols = Math.max(...todo.map((m) => m.cols)), maxRows = Math.max(...todo.map((m) => m.rows));
    let memory, matvec;
    try {
      memory = new WebAssembly.Memory({initial: Math.ceil(4 * (floats + maxCols + maxRows) / 65536)});
      matvec = new WebAssembly.Instance(new WebAssembly.Module(MATVEC_WASM), {env: {mem: memory}}).exports.matvec;
    } catch (e) {
      return false;  // no room for a second copy of the weights, or a page policy against WebAssembly: the loops
    }
    const f32 = new Float32Array(memory.buffer), xAt = floats, outAt = floats + maxCols;
    let at = 0;
    for (const m of todo) {
      const rows = m.rows, n = m.cols, ptr = 4 * at;
      if (m.w) f32.set(m.w, at);
      else for (let r = 0; r < rows; r++) {
        const s = m.scale[r], base = r * n;
        for (let i = 0; i < n; i++) f32[at + base + i] = m.q[base + i] * s;
      }
      at += rows * n;
      m.simd = (x, T, out, bias) => {
        for (let t = 0; t < T; t++) {
          f32.set(x.subarray(t * n, t * n + n), xAt);
          matvec(ptr, 4 * xAt, 4 * outAt, rows, n);
          const o = t * rows;
          if (bias) for (let r = 0; r < rows; r++) out[o + r] = f32[outAt + r] + bias[r];
          else out.set(f32.subarray(outAt, outAt + rows), o);
        }
      };
    }
    return true;
  }

  // --- the adaptive softmax (chargpt/model/adaptive.py): log-probabilities, the rare characters by cluster ----------------
  /** The layers of an adaptive softmax, and its ranking: ids by the text's counts, most used first, ties by id. */
  function adaptiveHead(t, vec, V) {
    const tails = [];
    for (let i = 0; t(`lm_head.tails.${i}.0.weight`); i++) {
      const out = t(`lm_head.tails.${i}.1.weight`);
      tails.push({proj: t(`lm_head.tails.${i}.0.weight`), out, outB: vec(`lm_head.tails.${i}.1.bias`),
                  mid: new Float32Array(out.cols), lp: new Float32Array(out.rows)});
    }
    const head = t("lm_head.head.weight"), f = vec("lm_head.frequency");
    const order = Array.from({length: V}, (_, i) => i).sort((a, b) => f[b] - f[a] || a - b);
    return {head, headB: vec("lm_head.head.bias"), tails, order, shortlist: head.rows - tails.length,
            lp: new Float32Array(head.rows)};
  }

  /** x's values, in place, minus their logsumexp (torch's log_softmax, summed in float64). */
  function logSoftmax(x) {
    let max = -Infinity, sum = 0;
    for (let i = 0; i < x.length; i++) if (x[i] > max) max = x[i];
    for (let i = 0; i < x.length; i++) sum += Math.exp(x[i] - max);
    const lse = max + Math.log(sum);
    for (let i = 0; i < x.length; i++) x[i] -= lse;
  }

  /** The hidden state h -> out[id] = log P(id): the shortlist's log-softmax, then each cluster's own log-softmax
   * plus its entry in the shortlist's, each written at its characters' ids. */
  function adaptiveLogProbs(A, h, out) {
    const s = A.shortlist;
    linear(A.head, h, 1, A.lp, A.headB);
    logSoftmax(A.lp);
    for (let r = 0; r < s; r++) out[A.order[r]] = A.lp[r];
    let at = s;
    A.tails.forEach((tail, i) => {
      linear(tail.proj, h, 1, tail.mid, null);
      linear(tail.out, tail.mid, 1, tail.lp, tail.outB);
      logSoftmax(tail.lp);
      for (let j = 0; j < tail.lp.length; j++) out[A.order[at + j]] = tail.lp[j] + A.lp[s + i];
      at += tail.lp.length;
    });
  }

  /** LayerNorm of x's n values at xo into out at oo (torch's nn.LayerNorm: biased variance, eps inside the root). */
  function layerNorm(x, xo, out, oo, [w, b], n, eps) {
    let mean = 0;
    for (let i = 0; i < n; i++) mean += x[xo + i];
    mean /= n;
    let v = 0;
    for (let i = 0; i < n; i++) { const d = x[xo + i] - mean; v += d * d; }
    const inv = 1 / Math.sqrt(v / n + eps);
    for (let i = 0; i < n; i++) out[oo + i] = (x[xo + i] - mean) * inv * w[i] + (b ? b[i] : 0);
  }

  // --- the model ----------------------------------------------------------------------------------------------------
  class Model {
    /** meta: the page's model description (chargpt/tools/webpage/pack.py); bytes: its weights (Uint8Array). */
    constructor(meta, bytes) {
      if (!LITTLE_ENDIAN) throw new Error("this page's weights are little-endian, and this machine is not");
      const c = meta.config;
      this.meta = meta;
      this.V = c.vocab_size; this.C = c.n_embd; this.block = c.block_size;
      this.nh = c.n_head; this.hs = c.n_embd / c.n_head;
      this.post = c.norm === "post"; this.relu = c.activation === "relu";
      this.eps = c.eps; this.embScale = c.emb_scale ? Math.fround(Math.sqrt(c.n_embd)) : 1;
      const t = (name) => tensor(meta, bytes, name);
      const vec = (name) => { const m = t(name); return m ? m.w : null; };
      this.wte = t("wte.weight"); this.wpe = t("wpe.weight");
      this.head = c.softmax === "adaptive" ? null : t("lm_head.weight") || this.wte;  // tied: the token embedding
      this.ada = c.softmax === "adaptive" ? adaptiveHead(t, vec, this.V) : null;
      this.lnf = c.norm === "pre" ? [vec("ln_f.weight"), vec("ln_f.bias")] : null;
      this.layers = [];
      for (let l = 0; l < c.n_layer; l++) {
        const p = `h.${l}.`;
        this.layers.push({
          ln1: [vec(p + "ln_1.weight"), vec(p + "ln_1.bias")], ln2: [vec(p + "ln_2.weight"), vec(p + "ln_2.bias")],
          attn: t(p + "attn.c_attn.weight"), attnB: vec(p + "attn.c_attn.bias"),
          proj: t(p + "attn.c_proj.weight"), projB: vec(p + "attn.c_proj.bias"),
          fc: t(p + "mlp.c_fc.weight"), fcB: vec(p + "mlp.c_fc.bias"),
          out: t(p + "mlp.c_proj.weight"), outB: vec(p + "mlp.c_proj.bias"),
        });
      }
      const C = this.C, B = this.block;  // room for a whole window: a prefill goes through at once
      this.x = new Float32Array(B * C); this.h = new Float32Array(B * C); this.a = new Float32Array(B * C);
      this.y = new Float32Array(B * C); this.qkv = new Float32Array(B * 3 * C); this.ff = new Float32Array(B * 4 * C);
      this.att = new Float64Array(B); this.acc = new Float64Array(this.hs);
      this.logits = new Float32Array(this.V);
      this.one = [0];  // the id of a step
      this.caches = [];  // a KV cache per row written together (a guided label: the text with it, and without)
      this.use(0);
      this.simd = meta.simd !== false && useSimd(this);  // meta.simd false: the plain loops (the tests compare both)
    }

    /** Compute with cache i (made on first use) from now on. */
    use(i) {
      while (this.caches.length <= i) {
        const size = this.block * this.C;
        this.caches.push({pos: 0, k: this.layers.map(() => new Float32Array(size)),
                          v: this.layers.map(() => new Float32Array(size))});
      }
      this.cache = this.caches[i];
    }

    get pos() { return this.cache.pos; }  // positions in the current cache

    reset() { this.cache.pos = 0; }

    /** ids at the next positions, through every layer, their keys and values cached; -> the logits after the last
     * (a buffer the next call overwrites), or null without `wantLogits`. */
    forward(ids, wantLogits) {
      const T = ids.length, C = this.C, x = this.x, h = this.h, a = this.a, ff = this.ff, n = T * C, start = this.pos;
      x.fill(0, 0, n);
      for (let t = 0; t < T; t++) {
        addRow(this.wte, ids[t], x, t * C, this.embScale);
        addRow(this.wpe, start + t, x, t * C, 1);
      }
      this.layers.forEach((L, l) => {
        if (!this.post) for (let t = 0; t < T; t++) layerNorm(x, t * C, h, t * C, L.ln1, C, this.eps);
        this.attention(L, this.cache.k[l], this.cache.v[l], this.post ? x : h, T, start, a);
        if (this.post) {
          for (let i = 0; i < n; i++) a[i] += x[i];
          for (let t = 0; t < T; t++) layerNorm(a, t * C, x, t * C, L.ln1, C, this.eps);
          this.mlp(L, x, T, a);
          for (let i = 0; i < n; i++) a[i] += x[i];
          for (let t = 0; t < T; t++) layerNorm(a, t * C, x, t * C, L.ln2, C, this.eps);
        } else {
          for (let i = 0; i < n; i++) x[i] += a[i];
          for (let t = 0; t < T; t++) layerNorm(x, t * C, h, t * C, L.ln2, C, this.eps);
          this.mlp(L, h, T, a);
          for (let i = 0; i < n; i++) x[i] += a[i];
        }
      });
      this.cache.pos += T;
      if (!wantLogits) return null;
      const last = (T - 1) * C;
      if (this.lnf) layerNorm(x, last, h, 0, this.lnf, C, this.eps);
      else for (let i = 0; i < C; i++) h[i] = x[last + i];
      if (this.ada) adaptiveLogProbs(this.ada, h, this.logits);
      else linear(this.head, h, 1, this.logits, null);
      return this.logits;
    }

    /** Causal self-attention of T positions from `start` (inputs inp, T x C) over the cache -> out (T x C). */
    attention(L, K, Vc, inp, T, start, out) {
      const C = this.C, C3 = 3 * C, hs = this.hs, qkv = this.qkv, att = this.att, acc = this.acc, y = this.y;
      const scale = 1 / Math.sqrt(hs);
      linear(L.attn, inp, T, qkv, L.attnB);
      for (let t = 0; t < T; t++) {
        const at = (start + t) * C, from = t * C3;
        for (let i = 0; i < C; i++) { K[at + i] = qkv[from + C + i]; Vc[at + i] = qkv[from + 2 * C + i]; }
      }
      for (let t = 0; t < T; t++) {
        const pos = start + t;  // this query sees keys 0 .. pos
        for (let head = 0; head < this.nh; head++) {
          const o = head * hs, q = t * C3 + o;
          let max = -Infinity;
          for (let p = 0; p <= pos; p++) {
            const base = p * C + o;
            let s = 0;
            for (let i = 0; i < hs; i++) s += qkv[q + i] * K[base + i];
            s *= scale;
            att[p] = s;
            if (s > max) max = s;
          }
          let sum = 0;
          for (let p = 0; p <= pos; p++) { const e = Math.exp(att[p] - max); att[p] = e; sum += e; }
          acc.fill(0);
          for (let p = 0; p <= pos; p++) {
            const w = att[p] / sum, base = p * C + o;
            for (let i = 0; i < hs; i++) acc[i] += w * Vc[base + i];
          }
          for (let i = 0; i < hs; i++) y[t * C + o + i] = acc[i];
        }
      }
      linear(L.proj, y, T, out, L.projB);
    }

    mlp(L, inp, T, out) {
      const ff = this.ff, n = T * 4 * this.C;
      linear(L.fc, inp, T, ff, L.fcB);
      if (this.relu) for (let i = 0; i < n; i++) { if (ff[i] < 0) ff[i] = 0; }
      else for (let i = 0; i < n; i++) { const v = ff[i]; ff[i] = 0.5 * v * (1 + erf(v * Math.SQRT1_2)); }
      linear(L.out, ff, T, out, L.outB);
    }

    /** A new cache holding ids (at most block_size), in one pass: -> the logits after the last. */
    prefill(ids) {
      this.reset();
      return this.forward(ids, true);
    }

    /** One character at the next position: -> the logits after it. */
    step(id) {
      this.one[0] = id;
      return this.forward(this.one, true);
    }
  }

  // --- writing ----------------------------------------------------------------------------------------------------------
  const nextTask = typeof setImmediate === "function" ? () => new Promise((r) => setImmediate(r)) : (() => {
    // a message to ourselves: a new task at once, where setTimeout(0) waits 4 ms after a few nested calls
    const channel = new MessageChannel(), waiting = [];
    channel.port1.onmessage = () => waiting.shift()();
    return () => new Promise((r) => { waiting.push(r); channel.port2.postMessage(0); });
  })();
  const now = typeof performance !== "undefined" ? () => performance.now() : () => Date.now();
  const SLICE_MS = 25;  // work between yields to the page: Stop and the text on screen answer within this

  const has = (o, k) => Object.prototype.hasOwnProperty.call(o, k);
  function abortError() {
    const message = "the signal was aborted before anything was written";
    return typeof DOMException === "function" ? new DOMException(message, "AbortError")
      : Object.assign(new Error(message), {name: "AbortError"});
  }

  class Generator {
    constructor(meta, bytes) {
      this.model = new Model(meta, bytes);
      this.chars = meta.chars;
      this.stoi = new Map(meta.chars.map((c, i) => [c, i]));
      // the vocabulary as the constraints read it; letters: which ids are text characters (Python's str.isalpha)
      this.vocab = {chars: this.chars, stoi: this.stoi, letters: Uint8Array.from(meta.letters || "", (b) => +(b === "1"))};
      this.sampler = new C.Sampler(this.model.V);
      this.cond = new Float32Array(this.model.V); this.work = new Float32Array(this.model.V);
      this.labels = meta.labels || null;  // a run trained with --labels: {null, names: {name: its character}}
      // never written: a labels run's label characters, and a --fim run's markers (the page writes left to right: it
      // does not fill in the middle, which sample.py --suffix does)
      const fim = meta.fim ? Object.values(meta.fim) : [];
      const never = [...(this.labels ? [this.labels.null, ...Object.values(this.labels.names)] : []), ...fim];
      this.never = never.length ? never.map((c) => this.stoi.get(c)) : null;
      this.queue = Promise.resolve();  // one generation at a time: they share the cache
      this.epoch = 0;  // stop() ends every generation begun before it
    }

    stop() { this.epoch++; }

    /** text -> ids; characters the model never saw: "error" (throws, naming them), "skip" or "replace". */
    encode(text, unknown) {
      const ids = [], missing = [];
      for (const c of text) {  // by code point, as Python's str
        const id = this.stoi.get(c);
        if (id !== undefined) ids.push(id);
        else if (unknown === "replace") ids.push(this.stoi.get(this.meta().replacement));
        else if (unknown !== "skip" && !missing.includes(c)) missing.push(c);
      }
      if (missing.length) {
        const shown = missing.slice(0, 10).map((c) => JSON.stringify(c)).join(" ");
        throw new Error(`the model never saw ${missing.length > 1 ? "these characters" : "this character"}: ${shown}` +
                        "; remove them from the prompt");
      }
      return ids;
    }

    meta() { return this.model.meta; }

    /** Yield the next ids, continuing the ids `context`, as chargpt/sampling/decode.py's decode(): choose(logits)
     * picks each (the logits are a buffer of its own to change). head, a labels run's: {never: ids never chosen,
     * uncond: the context with NULL first (guided), or none, guidance}; the label, first in context, stays first in
     * the window. Guided, each step computes the two rows, with the label and with NULL, in caches of their own, and
     * chooses from uncond + guidance x (cond - uncond), in float32, as decode() mixes its batch's two halves. never:
     * the ids never chosen (a labels run's labels, a --fim run's markers; none: the raw logits the export checks). */
    * ids(context, maxNew, choose, head = null, never = head ? head.never : null) {
      if (maxNew <= 0) return;
      const m = this.model, block = m.block, keep = Math.max(1, Math.floor((3 * block) / 4)), V = m.V;
      const pin = head ? 1 : 0, uncond = head && head.uncond, g = head ? head.guidance : 1, out = this.work;
      const last = (seq, n) => (seq.length <= n || !pin ? seq.slice(Math.max(0, seq.length - n))
        : [...seq.slice(0, pin), ...seq.slice(seq.length - Math.max(0, n - pin))]);  // decode()'s last()
      const seqs = uncond ? [last(context, block), last(uncond, block)] : [last(context, block)];
      const forward = (pass) => {  // pass(row) -> its logits; -> the logits to choose from
        m.use(0);
        const cond = pass(0);
        if (!uncond) out.set(cond);
        else {
          this.cond.set(cond);
          m.use(1);
          const free = pass(1);
          for (let i = 0; i < V; i++) out[i] = Math.fround(free[i] + Math.fround(g * Math.fround(this.cond[i] - free[i])));
        }
        if (never) for (const id of never) out[id] = -Infinity;
        return out;
      };
      let logits = forward((r) => m.prefill(seqs[r]));
      for (let step = 0; step < maxNew; step++) {
        const next = choose(logits);
        yield next;
        if (step + 1 === maxNew) return;
        for (let r = 0; r < seqs.length; r++) { seqs[r] = last(seqs[r], block - 1); seqs[r].push(next); }
        const full = m.pos >= block;  // full: rebuild from the last 3/4
        logits = forward((r) => (full ? m.prefill(last(seqs[r], keep)) : m.step(next)));
      }
    }

    /** A call checked whole before anything is written (every bad input an Error naming it): -> {o (the options),
     * seen (the prompt as the model reads it), rand, context (ids), contextText, planned (the constraints), head,
     * steered (the context's ids the constraints read: no label)}. */
    prepare(prompt, opts) {
      if (prompt !== undefined && prompt !== null && typeof prompt !== "string") {
        throw new Error(`the prompt must be a string, not ${typeof prompt}; give "" for none`);
      }
      const meta = this.meta(), o = C.settings(opts, meta.defaults);
      if (o.signal && o.signal.aborted) throw abortError();
      const ids = this.encode(prompt || "", o.unknown);
      let head = null;
      if (this.never && ids.some((i) => this.never.includes(i)) && !this.labels) {
        throw new Error("the prompt holds a fill-in-the-middle marker, a character this run keeps to itself; remove it");
      }
      if (!this.labels && o.label) throw new Error("this run was trained without labels, so it has no labels; drop label");
      if (this.labels) {
        if (ids.some((i) => this.never.includes(i))) {
          throw new Error("the prompt holds a label's own character; choose the label with the label option instead");
        }
        const names = this.labels.names, nullId = this.stoi.get(this.labels.null);
        if (o.label && !has(names, o.label)) {
          throw new Error(`unknown label ${JSON.stringify(o.label)}; this run's labels: ${Object.keys(names).slice(0, 50).join(", ")}`);
        }
        head = {label: o.label ? this.stoi.get(names[o.label]) : nullId, nullId, never: this.never, guidance: o.guidance};
      }
      const seen = ids.map((i) => this.chars[i]).join(""), rand = C.mulberry32(o.seed);
      let contextText = seen;
      if (!seen && o.form) {  // where the run's text starts text of the form's shape (sample.py's form_start)
        const starts = (meta.form_starts || {})[C.resolve(o.form, meta.forms)];
        if (starts && starts.length) contextText = starts[Math.floor(rand() * starts.length)];
      }
      contextText = contextText || meta.start_text;
      const context = this.encode(contextText, "skip");
      const planned = C.plan(o, this.vocab, contextText, meta.forms, this.never);
      const call = {o, seen, rand, context, contextText, planned, head, steered: context};  // steered: without a label
      if (head) {
        if (o.guidance !== 1) head.uncond = [head.nullId, ...context];
        call.context = [head.label, ...context];
      }
      return call;
    }

    /** Write after `prompt`; onText(piece) as it comes; -> a Promise of the whole text written (an Error, before
     * anything is written, for a bad call). opts: see constraints.js's OPTIONS. */
    stream(prompt, opts, onText) {
      let call;
      try {
        call = this.prepare(prompt, opts);
        if (onText !== undefined && onText !== null && typeof onText !== "function") throw new Error("onText must be a function");
      } catch (e) {
        return Promise.reject(e);
      }
      const run = this.queue.then(() => this._run(call, onText || (() => {})));
      this.queue = run.catch(() => {});
      return run;
    }

    async _run(call, onText) {
      const o = call.o, epoch = this.epoch;
      const ended = () => (o.signal && o.signal.aborted) || this.epoch !== epoch;
      if (o.signal && o.signal.aborted) throw abortError();  // aborted while an earlier call wrote
      const filter = new C.StopFilter(call.seen, o.stop);
      const steer = call.planned ? new C.Steer(call.planned, o.maxNewTokens, this.model.V, call.steered) : null;
      const choose = (logits) => this.sampler.choose(steer ? steer.apply(logits) : logits, o, call.rand);
      let text = "", last = now(), formEnded = false;
      for (const id of this.ids(call.context, o.maxNewTokens, choose, call.head, this.never)) {
        const piece = filter.feed(this.chars[id]);
        if (piece) { text += piece; onText(piece); }
        if (steer && steer.chose(id)) { formEnded = true; break; }  // the form is complete: the sample ends
        if (filter.done) break;
        if (now() - last > SLICE_MS) {
          await nextTask();
          last = now();
          if (ended()) return text;
        }
      }
      const rest = ended() ? "" : formEnded ? filter.end() : filter.done ? "" : filter.flush();
      if (rest) { text += rest; onText(rest); }
      return text;
    }

    generate(prompt, opts) { return this.stream(prompt, opts, null); }
  }

  return {base64Bytes, erf, Model, Generator, mulberry32: C.mulberry32, argmax: C.argmax, Sampler: C.Sampler,
          StopFilter: C.StopFilter, settings: C.settings, sampling: C};
});
