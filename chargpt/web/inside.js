// chargpt playground, Look inside: each character shaded by the model's surprise, what it expected there, and the
// attention maps of one context window (POST /api/inside).
import {$, current, el, fmt, state, status} from "./common.js";
import {api} from "./api.js";

function showChar(c) { return c === "\n" ? "↵" : c === "\t" ? "⇥" : c === " " ? "␣" : c; }

export function clearInside() {
  state.inside = null;
  state.pinned = null;
  $("inside-result").hidden = true;
  status("inside-status", "");
}

function surpriseColour(bits, scale) {
  // 0 bits: white; `scale` (a uniform guess over the vocabulary) or more: red, light enough to read on
  const t = Math.min(1, Math.max(0, bits / scale));
  const mix = (a, b, u) => Math.round(a + (b - a) * u);
  const [r, g, b] = t < 0.5 ? [255, mix(255, 196, t * 2), mix(255, 140, t * 2)]
    : [mix(255, 239, (t - 0.5) * 2), mix(196, 98, (t - 0.5) * 2), mix(140, 98, (t - 0.5) * 2)];
  return `rgb(${r}, ${g}, ${b})`;
}

export async function onAnalyse(end = null) {
  // end: the attention window ends just before this position (a pinned character outside the current window)
  const text = $("inside-text").value;
  const req = ++state.insideReq;  // only the latest analysis, of the run on screen, is shown
  if (end === null) clearInside();  // a new text: the old analysis goes (a moved window keeps it until the new one)
  if (!state.run || !text) { status("inside-status", "type or paste some text first", !text); return; }
  status("inside-status", "analysing…");
  document.body.dataset.inside = "busy";
  try {
    const data = await api("/api/inside", {run: state.run, text, top: 5, end});
    if (req !== state.insideReq) return;
    const raw = atob(data.attention);
    data.weights = Uint8Array.from(raw, (c) => c.charCodeAt(0));  // (layers, heads, window, window) x 255
    data.chars = Array.from(data.text);
    data.scale = Math.log2(Math.max(2, (current() || {}).vocab_size || 2));
    state.inside = data;
    if (end === null) state.pinned = null;
    state.layer = Math.min(state.layer, data.layers - 1);
    state.head = Math.min(state.head, data.heads - 1);
    renderSurprise();
    renderAttentionControls();
    drawAttention();
    drawHeads();
    $("inside-result").hidden = false;
    const shown = data.window < data.chars.length ? `; attention over characters ${data.window_start} to ` +
      `${data.window_start + data.window - 1}, one context window (click a character to move it there)` : "";
    const unseen = (data.unknown || []).length;  // not in the vocabulary: outlined, and not in the mean
    const scored = unseen ? `; ${unseen.toLocaleString()} of them unknown to this model, not scored` : "";
    status("inside-status", `${data.chars.length.toLocaleString()} characters${scored}, mean surprise ` +
      `${fmt(data.mean_bits)} bits/char (a uniform guess: ${fmt(data.scale)})${shown}`);
  } catch (err) {
    if (req !== state.insideReq) return;
    clearInside();  // the message alone: no earlier analysis under it
    status("inside-status", err.message, true);
  } finally {
    if (req === state.insideReq) document.body.dataset.inside = "done";
  }
}

function renderSurprise() {
  const d = state.inside;
  const unknown = new Set(d.unknown);
  const spans = d.chars.map((c, i) => {
    const span = el("span", {class: "c", "data-i": String(i)}, c === "\n" ? "↵\n" : c);
    if (c === "\n") span.classList.add("nl");
    if (unknown.has(i)) span.classList.add("unknown");
    else if (d.bits[i] !== null) span.style.backgroundColor = surpriseColour(d.bits[i], d.scale);
    return span;
  });
  if (state.pinned !== null) spans[state.pinned].classList.add("pinned");
  $("surprise").replaceChildren(...spans);
  $("surprise").dataset.shaded = String(d.bits.filter((b) => b !== null).length);
  $("legend").replaceChildren(el("span", {text: "0 bits"}), el("span", {class: "bar"}),
    el("span", {text: `${fmt(d.scale, 1)} bits (a uniform guess) or more`}));
  showExpected(state.pinned !== null ? state.pinned : d.chars.length);  // until a character is hovered
}

function showExpected(i) {
  const d = state.inside;
  const cands = d.expected[i] || [];
  const box = $("expected");
  if (i === 0) { box.replaceChildren("The first character has no text before it, so no expectation."); return; }
  const actual = d.chars[i];
  const head = i < d.chars.length
    ? `Position ${i}: ${JSON.stringify(actual)} — ` + (d.unknown.includes(i) ? "not in the vocabulary. "
      : `${fmt(d.bits[i], 2)} bits. `) + "The model expected: "
    : "After the text, the model expects: ";
  box.replaceChildren(head, ...cands.map(([c, p]) =>
    el("span", {class: c === actual ? "cand hit" : "cand", text: `${showChar(c)} ${(100 * p).toFixed(1)}%`})));
}

function renderAttentionControls() {
  const d = state.inside;
  $("layer").replaceChildren(...Array.from({length: d.layers}, (_, i) => el("option", {value: i, text: i + 1})));
  $("head").replaceChildren(...Array.from({length: d.heads}, (_, i) => el("option", {value: i, text: i + 1})));
  $("layer").value = state.layer;
  $("head").value = state.head;
}

function weight(layer, head, q, k) {
  const W = state.inside.window;
  return state.inside.weights[((layer * state.inside.heads + head) * W + q) * W + k] / 255;
}

function attnShade(w) {
  const t = Math.sqrt(w);  // small weights stay visible
  return `rgb(${Math.round(255 - 219 * t)}, ${Math.round(255 - 169 * t)}, ${Math.round(255 - 54 * t)})`;
}

function drawAttention() {
  const d = state.inside, W = d.window;
  const cell = Math.max(2, Math.min(24, Math.floor(560 / W)));
  const margin = cell >= 10 ? 16 : 0;  // room for the characters along the axes when cells are big enough
  const canvas = $("attn");
  canvas.width = canvas.height = margin + W * cell;
  const ctx = canvas.getContext("2d");
  ctx.fillStyle = "#ffffff";
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  for (let q = 0; q < W; q++) {
    for (let k = 0; k < W; k++) {  // the weights as they are: the causal mask left zeros above the diagonal
      ctx.fillStyle = attnShade(weight(state.layer, state.head, q, k));
      ctx.fillRect(margin + k * cell, margin + q * cell, cell, cell);
    }
  }
  if (margin) {
    ctx.fillStyle = "#5f6b7a";
    ctx.font = `${Math.min(12, cell)}px ${getComputedStyle(document.body).getPropertyValue("--mono")}`;
    ctx.textAlign = "center";
    ctx.textBaseline = "middle";
    for (let i = 0; i < W; i++) {
      const c = showChar(d.chars[d.window_start + i]);
      ctx.fillText(c, margin + i * cell + cell / 2, margin / 2);
      ctx.fillText(c, margin / 2, margin + i * cell + cell / 2);
    }
  }
  const pinnedRow = state.pinned === null ? -1 : state.pinned - d.window_start;
  if (pinnedRow >= 0 && pinnedRow < W) {
    const q = pinnedRow;
    ctx.strokeStyle = "#2456c9";
    ctx.lineWidth = 2;
    ctx.strokeRect(margin + 1, margin + q * cell + 1, W * cell - 2, cell - 2);
  }
  canvas.dataset.drawn = `${state.layer},${state.head}`;
  canvas.dataset.cell = String(cell);
  canvas.dataset.margin = String(margin);
  $("attn-caption").textContent = `Layer ${state.layer + 1}, head ${state.head + 1}: each row is a character ` +
    "(the query) and shows how much it attends to each earlier character (the keys); darker is more. Nothing " +
    "lies above the diagonal: the causal mask lets a character see only itself and what came before. " +
    "Hover over the map for values.";
}

function drawHeads() {
  const d = state.inside, W = d.window;
  const box = $("heads");
  box.style.gridTemplateColumns = `repeat(${d.heads}, minmax(0, 90px))`;
  const canvases = [];
  for (let layer = 0; layer < d.layers; layer++) {
    for (let head = 0; head < d.heads; head++) {
      const canvas = el("canvas", {width: W, height: W, title: `layer ${layer + 1}, head ${head + 1}`});
      const ctx = canvas.getContext("2d");
      const image = ctx.createImageData(W, W);
      for (let q = 0; q < W; q++) {
        for (let k = 0; k < W; k++) {
          const t = Math.sqrt(weight(layer, head, q, k)), at = 4 * (q * W + k);
          image.data[at] = 255 - 219 * t; image.data[at + 1] = 255 - 169 * t; image.data[at + 2] = 255 - 54 * t;
          image.data[at + 3] = 255;
        }
      }
      ctx.putImageData(image, 0, 0);
      canvas.classList.toggle("selected", layer === state.layer && head === state.head);
      canvas.addEventListener("click", () => { state.layer = layer; state.head = head; renderAttentionControls();
                                               drawAttention(); drawHeads(); });
      canvases.push(canvas);
    }
  }
  box.replaceChildren(...canvases);
  box.dataset.drawn = String(canvases.length);
}

function attentionHover(event) {
  const d = state.inside;
  if (!d) return;
  const canvas = $("attn"), rect = canvas.getBoundingClientRect();
  const scale = canvas.width / rect.width, cell = Number(canvas.dataset.cell), margin = Number(canvas.dataset.margin);
  const k = Math.floor(((event.clientX - rect.left) * scale - margin) / cell);
  const q = Math.floor(((event.clientY - rect.top) * scale - margin) / cell);
  if (q < 0 || k < 0 || q >= d.window || k >= d.window) return;
  const at = (i) => `${JSON.stringify(d.chars[d.window_start + i])} (position ${d.window_start + i})`;
  $("attn-caption").textContent = k > q ? `${at(q)} cannot see ${at(k)}: it comes later (the causal mask).`
    : `${at(q)} attends to ${at(k)} with weight ${fmt(weight(state.layer, state.head, q, k), 3)} ` +
      `(layer ${state.layer + 1}, head ${state.head + 1}).`;
}

function surpriseEvent(event, pin) {
  const span = event.target.closest(".c");
  if (!span || !state.inside) return;
  const i = Number(span.dataset.i);
  if (pin) {
    document.querySelectorAll("#surprise .pinned").forEach((s) => s.classList.remove("pinned"));
    state.pinned = state.pinned === i ? null : i;
    if (state.pinned !== null) span.classList.add("pinned");
    const d = state.inside;
    if (state.pinned !== null && (i < d.window_start || i >= d.window_start + d.window)) {
      onAnalyse(Math.min(d.chars.length, Math.max(i + 1, d.window)));  // a window that holds it
      return;
    }
    drawAttention();
  }
  showExpected(state.pinned !== null && !pin ? state.pinned : i);
}

export function initInside() {
  $("analyse").addEventListener("click", () => onAnalyse());
  $("surprise").addEventListener("mouseover", (e) => surpriseEvent(e, false));
  $("surprise").addEventListener("click", (e) => surpriseEvent(e, true));
  $("attn").addEventListener("mousemove", attentionHover);
  $("layer").addEventListener("change", () => { state.layer = Number($("layer").value); drawAttention(); drawHeads(); });
  $("head").addEventListener("change", () => { state.head = Number($("head").value); drawAttention(); drawHeads(); });
}
