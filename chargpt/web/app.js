// chargpt playground: the page's behaviour. Plain JavaScript, no build step, no libraries.
// Three views over the JSON API of chargpt/serve.py: Write (streamed generation), Look inside (surprise and
// attention), Runs (loss curves, configs, samples). Text is handled as code points (Array.from), as Python does.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { runs: [], run: null, job: null, inside: null, layer: 0, head: 0, pinned: null,
                plotted: new Set(), listed: new Set(), waiting: null, metrics: {}, unit: "bpc", poll: null, colours: {},
                writeReq: 0, insideReq: 0, detailReq: 0 };  // a request whose number is not the latest is stale
const COLOURS = ["#2456c9", "#d2462b", "#1b8a5a", "#8e44ad", "#c98a00", "#00838f", "#6d4c41", "#c2185b"];
const LN2 = Math.log(2);
const UNLIMITED = 1e12;  // max_iters of a run bounded by --max-time alone (config.UNLIMITED)
const VOCAB_SHOWN = 120;  // vocabulary characters shown before "show all"

// --- small helpers -----------------------------------------------------------------------------------------
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v; else if (k === "text") node.textContent = v; else node.setAttribute(k, v);
  }
  node.append(...children);
  return node;
}

function svg(tag, attrs = {}) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  return node;
}

async function api(path, body) {
  const init = body === undefined ? {} : {method: "POST", headers: {"Content-Type": "application/json"},
                                          body: JSON.stringify(body)};
  const response = await fetch(path, init);
  const data = await response.json().catch(() => ({error: `${response.status} ${response.statusText}`}));
  if (!response.ok) throw Object.assign(new Error(data.error || response.statusText), {data});
  return data;
}

function status(id, text, isError = false) {
  $(id).textContent = text;
  $(id).classList.toggle("error", isError);
}

function fmt(x, digits = 3) { return x === null || x === undefined ? "–" : Number(x).toFixed(digits); }
function showChar(c) { return c === "\n" ? "↵" : c === "\t" ? "⇥" : c === " " ? "␣" : c; }
function unescapeStop(s) { return s.replace(/\\([ntr\\])/g, (_, c) => ({n: "\n", t: "\t", r: "\r", "\\": "\\"})[c]); }
function numberOrNull(id) { const v = $(id).value.trim(); return v === "" ? null : Number(v); }

function params(n) {
  return n >= 1e6 ? `${(n / 1e6).toFixed(2)}M` : n >= 1e3 ? `${(n / 1e3).toFixed(1)}k` : String(n);
}

function ago(seconds) {
  const s = Date.now() / 1000 - seconds;
  return s < 90 ? `${Math.max(0, Math.round(s))} s ago` : s < 5400 ? `${Math.round(s / 60)} min ago`
    : s < 172800 ? `${Math.round(s / 3600)} h ago` : new Date(seconds * 1000).toLocaleDateString();
}

// --- views and the run picker ------------------------------------------------------------------------------
function showView(view) {
  document.body.dataset.view = view;
  for (const name of ["write", "inside", "runs"]) $(`view-${name}`).hidden = name !== view;
  clearInterval(state.poll);
  if (view === "runs") {
    refreshRuns();
    state.poll = setInterval(refreshRuns, 3000);  // runs still training update live
  }
}

async function loadRuns() {
  const data = await api("/api/runs");
  state.runs = data.runs;
  $("runs-folder").textContent = `in ${data.folder}`;
  const picker = $("run"), names = state.runs.map((r) => r.name);
  if (Array.from(picker.options, (o) => o.value).join("\n") !== names.join("\n")) {  // rebuilt only on change
    picker.replaceChildren(...names.map((n) => el("option", {value: n, text: n})));
  }
  $("no-runs").hidden = state.runs.length > 0;
  $("no-runs").textContent = `No trained runs in ${data.folder} yet. Train one with: python train.py ` +
    "(this page picks it up as soon as its first checkpoint is saved).";
  if (!names.includes(state.run)) state.run = names.length ? newest(state.runs).name : null;
  picker.value = state.run;
  renderFacts();
  renderWriteMode();
  // every run the page has not listed before is plotted (the first listing, and runs that appear later); a run
  // unticked by hand stays unticked
  names.filter((n) => !state.listed.has(n)).forEach((n) => { state.listed.add(n); state.plotted.add(n); });
  if (!names.length && !state.waiting) {  // an empty folder: look again until its first run appears
    state.waiting = setInterval(() => loadRuns().then(() => {
      if (state.runs.length) { clearInterval(state.waiting); state.waiting = null; }
    }).catch(() => {}), 3000);
  }
}

function newest(runs) { return runs.reduce((a, b) => (b.updated > a.updated ? b : a)); }
function current() { return state.runs.find((r) => r.name === state.run); }

function selectRun(name) {
  if (name !== state.run) forgetOutputs();
  state.run = name;
  $("run").value = name;
  renderFacts();
  renderWriteMode();
  if (document.body.dataset.view === "runs") { renderRunsTable(); showRunDetail(); }
}

function translates(r) { return Boolean(r && r.task === "pairs"); }

function forgetOutputs() {
  // what Write and Look inside show belongs to the run that made it: another run starts them empty (a generation
  // still running is stopped, and its late pieces go nowhere)
  if (state.job && document.body.dataset.state === "generating") onStop();
  state.writeReq++;
  state.insideReq++;
  clearWrite();
  clearInside();
  if (document.body.dataset.inside === "busy") document.body.dataset.inside = "idle";
}

function clearWrite() {
  $("outputs").replaceChildren();
  delete $("outputs").dataset.novelty;
  $("prompt-marks").hidden = true;
  status("write-status", "");
  $("to-inside").disabled = true;
}

function clearInside() {
  state.inside = null;
  state.pinned = null;
  $("inside-result").hidden = true;
  status("inside-status", "");
}

function renderWriteMode() {
  // a run trained on sentence pairs turns Write into a translation box: source in, translation out (greedy by
  // default); Look inside reads one text, so an encoder-decoder (source and target apart) cannot use it
  const r = current(), pairs = translates(r), mode = pairs ? "translate" : "write";
  if (document.body.dataset.mode !== mode) {
    $("prompt").parentElement.firstChild.textContent = pairs ? "Sentence to translate" : "Prompt";
    $("prompt").placeholder = pairs ? "Type a sentence in the source language; its translation appears below"
      : "Type the start of a text, or leave it empty to begin a new paragraph";
    $("generate").textContent = pairs ? "Translate" : "Generate";
    $("temperature").value = pairs ? "0" : "0.8";  // translations: the most likely characters
    document.body.dataset.mode = mode;
  }
  $("to-inside").hidden = Boolean(r && r.arch === "encoder-decoder");
}

function renderFacts() {
  const r = current();
  const kind = translates(r) ? `translation (${r.arch}) · ` : "";
  $("run-facts").textContent = !r ? "" : r.error ? `this run cannot be read: ${r.error}` :
    `${r.corpus} · ${kind}${params(r.params)} parameters (${r.layers} layer${r.layers === 1 ? "" : "s"} × ${r.width}, ` +
    `${r.heads} heads, context ${r.block_size}) · step ${r.step} · best val loss ${fmt(r.best_val_loss)} nats ` +
    `(${fmt(r.best_bpc)} bits/char) · ${r.vocab_size} characters`;
}

// --- Write -------------------------------------------------------------------------------------------------
async function* sseEvents(response) {
  // server-sent events from a POST: "event: NAME\ndata: JSON\n\n", read as it arrives
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const {value, done} = await reader.read();
    if (done) return;
    buffer += value;
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      let event = "message", data = "";
      for (const line of block.split("\n")) {
        if (line.startsWith("event: ")) event = line.slice(7);
        else if (line.startsWith("data: ")) data += line.slice(6);
      }
      yield {event, data: JSON.parse(data)};
    }
  }
}

function writeSettings() {
  // an empty box is left out: the server then uses sample.py's default for it
  const stop = $("stop").value;
  const body = {run: state.run, prompt: $("prompt").value, temperature: numberOrNull("temperature"),
                top_k: numberOrNull("top-k"), top_p: numberOrNull("top-p"), max_new_tokens: numberOrNull("length"),
                seed: numberOrNull("seed"), num_samples: numberOrNull("samples"), unknown: $("unknown").value,
                stop: stop ? [unescapeStop(stop)] : []};
  return Object.fromEntries(Object.entries(body).filter(([, v]) => v !== null));
}

async function generate(body, onStart, onText) {
  // -> the `done` event; throws with the server's message when the request is refused
  const response = await fetch("/api/generate", {method: "POST", headers: {"Content-Type": "application/json"},
                                                 body: JSON.stringify(body)});
  if (!response.ok) {
    const data = await response.json().catch(() => ({error: response.statusText}));
    throw Object.assign(new Error(data.error), {data});
  }
  for await (const {event, data} of sseEvents(response)) {
    if (event === "start") onStart(data);
    else if (event === "text") onText(data);
    else if (event === "done") return data;
  }
  return {stopped: true, chars: 0, error: "the connection closed early"};
}

function sourceLines(text) {
  // one sentence per line, as chargpt translate reads a file: \r\n or \n ends a line, a final newline starts none
  const lines = text.split("\n").map((line) => line.replace(/\r$/, ""));
  if (lines.length > 1 && lines[lines.length - 1] === "") lines.pop();
  return lines;
}

async function onGenerate() {
  if (document.body.dataset.state === "generating") return;
  if (!state.run) { status("write-status", "no run to write with yet: train one first (python train.py)", true); return; }
  const req = ++state.writeReq;  // from here on, only this request's output is shown
  const stale = () => req !== state.writeReq;
  const body = writeSettings();
  const pairs = translates(current());
  // a translation run translates each line by itself (blank lines stay blank); a text run continues the prompt
  const lines = pairs ? sourceLines(body.prompt) : [body.prompt];
  const offsets = lines.map((_, i) => lines.slice(0, i).reduce((n, l) => n + Array.from(l).length + 1, 0));
  state.job = null;
  state.stopWanted = false;
  clearWrite();
  const outputs = $("outputs");
  const texts = [];
  let nodes = [], pending = "", chars = 0, seconds = 0, done = null, line = 0;
  const put = (piece) => {  // text every sample gets: a line break between translations
    if (!nodes.length) { pending += piece; return; }
    nodes.forEach((x, i) => { texts[i] += piece; x.gen.data += piece; });
  };
  document.body.dataset.state = "generating";
  $("generate").disabled = true;
  $("stop-button").disabled = false;
  status("write-status", "starting…");
  try {
    for (line = 0; line < lines.length; line++) {
      if (line > 0) put("\n");
      if (pairs && !lines[line].trim()) continue;
      if (state.stopWanted) break;
      done = await generate({...body, prompt: lines[line]}, (start) => {
        if (stale()) return;
        state.job = {id: start.id, prompt: pairs ? "" : start.prompt, texts, seed: start.seed, warning: start.warning};
        if (body.seed === null || body.seed === undefined) body.seed = start.seed;  // every line: the seed shown
        if (!nodes.length) {
          const n = start.settings.num_samples, name = pairs ? "translation" : "sample";
          nodes = Array.from({length: n}, (_, i) => {
            texts.push(pending);
            const gen = document.createTextNode(pending);
            const box = el("div", {class: "sample", "data-i": String(i)},
              el("h3", {text: n > 1 ? `${name} ${i + 1} of ${n}` : name}),
              el("pre", {}, el("span", {class: "prompt", text: state.job.prompt}), el("span", {class: "gen"}, gen)));
            return {box, gen};
          });
          outputs.replaceChildren(...nodes.map((x) => x.box));
        }
        const where = lines.length > 1 ? ` · line ${line + 1} of ${lines.length}` : "";
        status("write-status", `writing… seed ${start.seed}${where}` + (start.warning ? ` · ${start.warning}` : ""));
        if (state.stopWanted) onStop();  // Stop was pressed before the generation had an id
      }, (pieces) => {
        if (stale()) return;
        for (const [i, piece] of pieces) { texts[i] += piece; nodes[i].gen.data += piece; }
      });
      if (stale()) return;
      chars += done.chars;
      seconds += done.seconds;
      if (done.error || done.stopped || state.stopWanted) break;
    }
    if (!done) {
      status("write-status", state.stopWanted ? "stopped" : "nothing to translate: type a sentence, one per line",
             !state.stopWanted);
      return;
    }
    const rate = seconds > 0 ? Math.round(chars / seconds) : 0;
    const stopped = done.stopped || state.stopWanted;
    const what = done.error ? `stopped by an error: ${done.error}` : stopped ? "stopped" : "done";
    const reached = Math.min(line + 1, lines.length);
    const count = pairs && lines.length > 1 ? (stopped ? ` · line ${reached} of ${lines.length}` : ` · ${lines.length} lines`) : "";
    status("write-status", `${what}${count} · ${chars} characters in ${fmt(seconds, 2)} s (${rate} chars/s) · ` +
      `seed ${state.job.seed}` + (state.job.warning ? ` · ${state.job.warning}` : ""), Boolean(done.error));
    $("to-inside").disabled = false;
    if ($("novelty").checked && !done.error) await markCopied(body.run, texts, nodes, stale);
  } catch (err) {
    if (stale()) return;
    outputs.replaceChildren();  // an error is the whole answer: no half of an earlier request under it
    status("write-status", (lines.length > 1 ? `line ${line + 1}: ` : "") + err.message, true);
    if (err.data && err.data.unknown_chars) {
      markUnknown(body.prompt, err.data.unknown_chars.map(([i, c]) => [i + offsets[line], c]));
    }
  } finally {
    document.body.dataset.state = "done";
    $("generate").disabled = false;
    $("stop-button").disabled = true;
  }
}

async function markCopied(run, texts, nodes, stale = () => false) {
  // shade the spans of each sample that occur verbatim in the run's training text (chargpt.novelty), the line
  // they come from in each one's tooltip, and the share copied under the sample
  $("outputs").dataset.novelty = "checking";
  for (let i = 0; i < texts.length; i++) {
    const box = nodes[i].box;
    let data;
    try { data = await api("/api/novelty", {run, text: texts[i]}); } catch (err) {
      if (stale()) return;
      box.append(el("p", {class: "novelty status error", text: `copied text: ${err.message}`}));
      continue;
    }
    if (stale()) return;  // another run or request is on screen now
    const chars = Array.from(texts[i]), pieces = [];  // offsets count code points, as in Python
    let at = 0;
    for (const s of data.segments) {
      if (s.start > at) pieces.push(chars.slice(at, s.start).join(""));
      pieces.push(el("mark", {class: "copied", "data-line": String(s.line),
                              title: `copied from ${data.unit} ${s.line.toLocaleString("en")} of the training text: ` +
                                     (s.context ? `(${s.context}) ` : "") + s.excerpt},
                         chars.slice(s.start, s.end).join("")));
      at = s.end;
    }
    if (at < chars.length) pieces.push(chars.slice(at).join(""));
    box.querySelector(".gen").replaceChildren(...pieces);
    box.append(el("p", {class: "novelty hint", text: data.summary}));
  }
  $("outputs").dataset.novelty = "done";
}

function markUnknown(prompt, found) {
  // show the prompt with the characters the model never saw outlined
  const bad = new Set(found.map(([i]) => i));
  const spans = Array.from(prompt).map((c, i) =>
    el("span", {class: bad.has(i) ? "c unknown" : "c", title: bad.has(i) ? "not in this model's vocabulary" : ""},
       c === "\n" ? "↵\n" : c));
  $("prompt-marks").replaceChildren(...spans);
  $("prompt-marks").hidden = false;
}

async function onStop() {
  $("stop-button").disabled = true;
  state.stopWanted = true;  // a translation between two lines stops before the next one
  if (!state.job) return;
  await api("/api/stop", {id: state.job.id}).catch(() => {});  // already finished: nothing to stop
}

function toInside() {
  if (!state.job) return;
  $("inside-text").value = state.job.prompt + (state.job.texts[0] || "");
  showView("inside");
  onAnalyse();
}

// --- Look inside ---------------------------------------------------------------------------------------------
function surpriseColour(bits, scale) {
  // 0 bits: white; `scale` (a uniform guess over the vocabulary) or more: red, light enough to read on
  const t = Math.min(1, Math.max(0, bits / scale));
  const mix = (a, b, u) => Math.round(a + (b - a) * u);
  const [r, g, b] = t < 0.5 ? [255, mix(255, 196, t * 2), mix(255, 140, t * 2)]
    : [mix(255, 239, (t - 0.5) * 2), mix(196, 98, (t - 0.5) * 2), mix(140, 98, (t - 0.5) * 2)];
  return `rgb(${r}, ${g}, ${b})`;
}

async function onAnalyse(end = null) {
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

// --- Runs ----------------------------------------------------------------------------------------------------
async function refreshRuns() {
  try {
    await loadRuns();
    await Promise.all([...state.plotted].map(fetchMetrics));
    renderRunsTable();
    drawChart();
    const detail = $("run-detail"), r = current();
    if (detail.dataset.run !== state.run) showRunDetail();
    else if (r && String(r.updated) !== detail.dataset.updated) refreshSamples();  // a run training: new samples
  } catch (err) {
    $("chart").textContent = `cannot read the runs: ${err.message}`;
  }
}

async function fetchMetrics(name) {
  if (!state.runs.some((r) => r.name === name)) { state.plotted.delete(name); return; }
  const known = state.metrics[name];
  const query = known && known.mtime ? `?since=${encodeURIComponent(known.mtime)}` : "";
  const data = await api(`/api/runs/${encodeURIComponent(name)}/metrics${query}`);
  if (!data.unchanged) state.metrics[name] = data;
}

function colourOf(name) {
  // keyed to the run: a run keeps its colour when others appear or go. Its first choice comes from its name; a
  // colour already taken moves it to the next free one
  if (!state.colours[name]) {
    const taken = new Set(Object.values(state.colours));
    const first = Array.from(name).reduce((h, c) => (h * 31 + c.codePointAt(0)) >>> 0, 7) % COLOURS.length;
    const free = COLOURS.map((_, i) => COLOURS[(first + i) % COLOURS.length]).find((c) => !taken.has(c));
    state.colours[name] = free || COLOURS[first];
  }
  return state.colours[name];
}

function renderRunsTable() {
  const rows = state.runs.map((r) => {
    const box = el("input", {type: "checkbox", "aria-label": `plot ${r.name}`});
    box.checked = state.plotted.has(r.name);
    box.addEventListener("change", async () => {
      if (box.checked) { state.plotted.add(r.name); await fetchMetrics(r.name); } else state.plotted.delete(r.name);
      drawChart();
    });
    const name = el("button", {class: "link", text: r.name, title: "show this run and use it in Write and Look inside"});
    name.addEventListener("click", () => selectRun(r.name));
    const live = r.training;
    return el("tr", {class: r.name === state.run ? "current" : ""},
      el("td", {}, box), el("td", {}, el("span", {class: "swatch"}), name),
      el("td", {text: r.error ? "unreadable" : r.corpus}), el("td", {class: "num", text: r.error ? "" : params(r.params)}),
      el("td", {class: "num", text: r.error ? "" : String(r.step)}), el("td", {class: "num", text: fmt(r.best_val_loss, 4)}),
      el("td", {class: "num", text: fmt(r.best_bpc)}),
      el("td", {class: live ? "live" : "", text: ago(r.updated),
                title: live ? "training now: its curves update as it evaluates" : ""}));
  });
  $("runs-table").tBodies[0].replaceChildren(...rows);
  $("runs-table").querySelectorAll(".swatch").forEach((s, i) => {
    s.style.background = colourOf(state.runs[i].name);
    s.dataset.colour = colourOf(state.runs[i].name);
  });
}

function chartTitle(names) {
  // as curves.png's title: the run, its corpus and its model; several runs: how many (colours as in the table)
  const runs = names.map((n) => state.runs.find((r) => r.name === n)).filter((r) => r && !r.error);
  if (runs.length === 1) {
    const r = runs[0];
    return `${r.name}: corpus ${r.corpus}, ${r.layers} layer${r.layers === 1 ? "" : "s"} × ${r.width}, ` +
      `${r.heads} heads, context ${r.block_size}, ${params(r.params)} parameters`;
  }
  const corpora = new Set(runs.map((r) => r.corpus));
  return runs.length ? `${runs.length} runs` + (corpora.size === 1 ? ` on ${[...corpora][0]}` : "") +
    " (colours as in the table)" : "";
}

function size(bytes) {
  // 812 B, 4.1 kB, 2.31 MB: never "0.00 MB" for a small file
  const units = ["B", "kB", "MB", "GB"];
  let i = 0;
  while (bytes >= 1000 && i < units.length - 1) { bytes /= 1000; i++; }
  return i === 0 ? `${bytes} B` : `${bytes.toPrecision(bytes >= 100 ? 3 : 2 + (bytes < 10))} ${units[i]}`;
}

function settingText(key, v) {
  if (v === null) return "default";
  if (key === "max_iters" && v >= UNLIMITED) return "no step limit (max_time decides)";
  return String(v);
}

function visibleChar(c) {
  // as the vocabulary preview always showed it: newline and tab as \n and \t, other invisible characters as \uXXXX
  if (c === "\n") return "\\n";
  if (c === "\t") return "\\t";
  return /\p{C}/u.test(c) ? `\\u${c.codePointAt(0).toString(16).padStart(4, "0")}` : c;
}

function vocabSummary(list, total) {
  // "5,053 characters (4,981 Han, 52 Latin, ...)", the first VOCAB_SHOWN, and the rest behind "show all"
  const kinds = [["Han", /\p{Script=Han}/u], ["kana", /[\p{Script=Hiragana}\p{Script=Katakana}]/u],
                 ["Hangul", /\p{Script=Hangul}/u], ["Latin", /\p{Script=Latin}/u], ["Cyrillic", /\p{Script=Cyrillic}/u],
                 ["Greek", /\p{Script=Greek}/u], ["digits", /\p{N}/u], ["punctuation", /[\p{P}\p{S}]/u],
                 ["whitespace", /\s/u]];
  const counts = new Map();
  for (const c of list) {
    const kind = (kinds.find(([, re]) => re.test(c)) || ["other"])[0];
    counts.set(kind, (counts.get(kind) || 0) + 1);
  }
  const parts = [...counts].sort((a, b) => b[1] - a[1]).map(([k, n]) => `${n.toLocaleString("en")} ${k}`);
  const head = `vocabulary: ${Number(total).toLocaleString("en")} characters` +
    (list.length > VOCAB_SHOWN ? ` (${parts.join(", ")})` : "");
  const text = (chars) => chars.map(visibleChar).join("");
  const box = el("div", {class: "vocab-box"}, el("p", {class: "hint", text: head}));
  if (list.length <= VOCAB_SHOWN) { box.append(el("p", {class: "vocab", text: text(list)})); return box; }
  box.append(el("p", {class: "vocab", text: text(list.slice(0, VOCAB_SHOWN)) + " …"}),
             el("details", {class: "vocab-all"}, el("summary", {text: `show all ${list.length.toLocaleString("en")}`}),
                el("p", {class: "vocab", text: text(list)})));
  return box;
}

function niceTicks(lo, hi, count) {
  const span = hi - lo || 1, raw = span / count, mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => s >= raw);
  const ticks = [];
  for (let t = Math.ceil(lo / step) * step; t <= hi + 1e-9; t += step) ticks.push(Number(t.toPrecision(12)));
  return ticks;
}

function drawChart() {
  const unit = state.unit, key = (split) => (unit === "bpc" ? `${split}_bpc` : `${split}_loss`);
  const series = [...state.plotted].filter((n) => state.metrics[n] && state.metrics[n].rows.length)
    .map((n) => ({name: n, rows: state.metrics[n].rows, running: state.metrics[n].running || []}));
  const box = $("chart");
  $("chart-title").textContent = chartTitle(series.map((s) => s.name));
  if (!series.length) {
    box.textContent = "No evaluations logged yet for the runs ticked above (metrics.jsonl gets a line per evaluation).";
    box.dataset.curves = "0";
    return;
  }
  const value = (row, split) => (row[key(split)] !== undefined ? row[key(split)]
    : unit === "bpc" ? row[`${split}_loss`] / LN2 : row[`${split}_bpc`] * LN2);
  const points = series.flatMap((s) => [...s.rows.flatMap((r) => [value(r, "train"), value(r, "val")]),
                                        ...s.running.map((r) => value(r, "train"))]).filter((v) => Number.isFinite(v));
  const steps = series.flatMap((s) => [...s.rows, ...s.running].map((r) => r.step));
  const [W, H, L, R, T, B] = [760, 340, 56, 16, 12, 40];
  const xmax = Math.max(1, ...steps), ylo = Math.min(...points), yhi = Math.max(...points);
  const pad = (yhi - ylo) * 0.05 || 0.1;
  const [y0, y1] = [Math.max(0, ylo - pad), yhi + pad];
  const x = (s) => L + (s / xmax) * (W - L - R), y = (v) => T + (1 - (v - y0) / (y1 - y0)) * (H - T - B);
  const root = svg("svg", {viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "loss curves"});
  for (const t of niceTicks(y0, y1, 6)) {
    root.append(svg("line", {class: "grid", x1: L, x2: W - R, y1: y(t), y2: y(t)}));
    const label = svg("text", {x: L - 6, y: y(t) + 4, "text-anchor": "end"});
    label.textContent = String(t);
    root.append(label);
  }
  for (const t of niceTicks(0, xmax, 8)) {
    const label = svg("text", {x: x(t), y: H - B + 16, "text-anchor": "middle"});
    label.textContent = String(t);
    root.append(label);
  }
  root.append(svg("line", {class: "axis", x1: L, x2: W - R, y1: H - B, y2: H - B}),
              svg("line", {class: "axis", x1: L, x2: L, y1: T, y2: H - B}));
  const xlabel = svg("text", {x: (L + W - R) / 2, y: H - 6, "text-anchor": "middle"});
  xlabel.textContent = "step";
  const ylabel = svg("text", {x: 14, y: (T + H - B) / 2, "text-anchor": "middle", transform: `rotate(-90 14 ${(T + H - B) / 2})`});
  ylabel.textContent = unit === "bpc" ? "loss (bits per character)" : "loss (nats)";
  root.append(xlabel, ylabel);
  let curves = 0;
  for (const s of series) {
    const colour = colourOf(s.name);
    const dense = s.running.filter((r) => Number.isFinite(value(r, "train")));
    if (dense.length) {  // the running training loss, every few steps: thin, under the evaluated curves
      const d = dense.map((r, i) => `${i ? "L" : "M"}${x(r.step).toFixed(1)},${y(value(r, "train")).toFixed(1)}`).join("");
      root.append(svg("path", {class: "curve running", d, fill: "none", stroke: colour, "stroke-width": 1,
                               "stroke-opacity": 0.4, "data-run": s.name}));
    }
    for (const split of ["train", "val"]) {
      const rows = s.rows.filter((r) => Number.isFinite(value(r, split)));
      if (!rows.length) continue;
      const d = rows.map((r, i) => `${i ? "L" : "M"}${x(r.step).toFixed(1)},${y(value(r, split)).toFixed(1)}`).join("");
      root.append(svg("path", {class: `curve ${split}`, d, fill: "none", stroke: colour, "stroke-width": split === "val" ? 2 : 1.5,
                               "stroke-dasharray": split === "val" ? "" : "5 4", "data-run": s.name}));
      curves++;
      if (split === "val") {
        for (const r of rows) {
          const dot = svg("circle", {cx: x(r.step), cy: y(value(r, split)), r: 2.5, fill: colour});
          const tip = svg("title");
          tip.textContent = `${s.name}, step ${r.step}: val ${fmt(value(r, "val"))}, train ${fmt(value(r, "train"))} ` +
            (unit === "bpc" ? "bits/char" : "nats");
          dot.append(tip);
          root.append(dot);
        }
      }
    }
  }
  box.replaceChildren(root);
  box.dataset.curves = String(curves);
}

async function fetchDetail() {
  // -> the selected run's details, or null when another run was selected (or asked for) meanwhile
  const name = state.run, req = ++state.detailReq;
  const r = await api(`/api/runs/${encodeURIComponent(name)}`);
  return req === state.detailReq && name === state.run ? r : null;
}

function duringTraining(r) {
  // what it wrote while training (--sample-every): the same prompt and seed each time, so the model learning shows
  const during = (r.samples || []).map((s) => el("div", {class: "sample during"}, el("h3", {text: `step ${s.step}`}),
    el("pre", {}, el("span", {class: "prompt", text: String(s.prompt ?? "")}), el("span", {class: "gen", text: String(s.text ?? "")}))));
  return during.length ? [el("h3", {text: `Samples while training (${during.length})`}), ...during] : [];
}

async function refreshSamples() {
  const box = $("run-detail");
  box.dataset.updated = String((current() || {}).updated);  // asked once per change
  const r = await fetchDetail().catch(() => null);
  if (!r || r.error || box.dataset.run !== r.name) return;
  $("run-samples").replaceChildren(...duringTraining(r));
  $("run-saved").textContent = `saved ${r.saved_at || "?"} · corpus ${r.corpus}`;
}

async function showRunDetail() {
  const box = $("run-detail");
  if (!state.run) { box.replaceChildren(); delete box.dataset.run; return; }
  box.dataset.run = state.run;
  box.dataset.updated = String((current() || {}).updated);
  box.replaceChildren(el("h2", {text: state.run}), el("p", {class: "hint", text: "loading…"}));
  let r;
  try { r = await fetchDetail(); } catch (err) {
    if (box.dataset.run === state.run) box.replaceChildren(el("p", {class: "status error", text: err.message}));
    return;
  }
  if (!r) return;  // another run was selected meanwhile: its own detail is on its way
  if (r.error) { box.replaceChildren(el("h2", {text: r.name}), el("p", {class: "status error", text: r.error})); return; }
  const table = (title, obj) => el("div", {}, el("h3", {text: title}), el("table", {},
    ...Object.entries(obj || {}).map(([k, v]) => el("tr", {}, el("td", {text: k}),
      el("td", {class: "num", text: settingText(k, v)})))));
  const files = Object.fromEntries(Object.entries(r.files).map(([k, v]) => [k, size(v)]));
  const tc = r.train_config || {};
  const sampleChars = tc.sample_chars || 300, seed = tc.seed ?? 1337, prompt = r.closing_prompt || "";
  const button = el("button", {type: "button", text: `Write a sample (${sampleChars} characters, seed ${seed})`});
  const out = el("pre", {class: "sample-text"});
  const note = el("p", {class: "hint", text: "From its best checkpoint, at temperature 0.8 and the run's own seed: " +
    "what training prints when it ends" + (prompt ? `, from the start of a validation line, ${JSON.stringify(prompt)}.`
      : ".")});
  if (r.task === "pairs") {  // nothing to continue: a translator needs a sentence
    button.hidden = true;
    note.textContent = "A translation run: type a sentence in Write to translate it.";
  }
  button.addEventListener("click", async () => {
    button.disabled = true;
    out.textContent = "";
    try {
      out.textContent = prompt;
      const done = await generate({run: r.name, prompt, max_new_tokens: sampleChars, temperature: 0.8, seed},
        () => {}, (pieces) => { if (box.dataset.run === r.name) for (const [, p] of pieces) out.textContent += p; });
      if (done.error) out.textContent += `\n[${done.error}]`;
    } catch (err) { out.textContent = err.message; } finally { button.disabled = false; }
  });
  box.replaceChildren(el("h2", {text: `${r.name}`}),
    el("p", {class: "hint", id: "run-saved", text: `saved ${r.saved_at || "?"} · corpus ${r.corpus}`}),
    vocabSummary(Array.isArray(r.vocab_chars) ? r.vocab_chars : Array.from(r.vocab_preview || ""), r.vocab_size),
    ...lineage(r),
    el("h3", {text: "Sample"}), note, button, el("div", {class: "sample"}, out),
    el("div", {id: "run-samples"}, ...duringTraining(r)),
    el("div", {class: "config"}, table("Model", r.model_config), table("Training", tc), table("Files", files)));
}

// the run this one started from (train --init-from RUN), as chargpt info shows it; nothing for a run from scratch
function lineage(r) {
  const b = r.init_from;
  if (!b) return [];
  const val = typeof b.val_loss === "number" ? `, val loss ${fmt(b.val_loss, 4)}` : "";
  return [el("p", {class: "hint lineage", text: `started from ${b.path} (${b.weights || "?"} weights, step ` +
    `${b.step ?? 0} on ${b.corpus || "?"}${val}); ${(b.added_chars ?? 0).toLocaleString()} characters added to its vocabulary`})];
}

// --- wiring --------------------------------------------------------------------------------------------------
function init() {
  document.querySelectorAll(".tab").forEach((b) => b.addEventListener("click", () => showView(b.dataset.view)));
  $("run").addEventListener("change", () => selectRun($("run").value));
  $("generate").addEventListener("click", onGenerate);
  $("stop-button").addEventListener("click", onStop);
  $("to-inside").addEventListener("click", toInside);
  $("prompt").addEventListener("keydown", (e) => { if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) onGenerate(); });
  $("analyse").addEventListener("click", () => onAnalyse());
  $("surprise").addEventListener("mouseover", (e) => surpriseEvent(e, false));
  $("surprise").addEventListener("click", (e) => surpriseEvent(e, true));
  $("attn").addEventListener("mousemove", attentionHover);
  $("layer").addEventListener("change", () => { state.layer = Number($("layer").value); drawAttention(); drawHeads(); });
  $("head").addEventListener("change", () => { state.head = Number($("head").value); drawAttention(); drawHeads(); });
  document.querySelectorAll("input[name=unit]").forEach((r) => r.addEventListener("change", () => {
    state.unit = r.value;
    drawChart();
  }));
  loadRuns().then(() => { document.body.dataset.ready = "1"; })
    .catch((err) => { $("no-runs").hidden = false; $("no-runs").textContent = `cannot reach the server: ${err.message}`; });
}

document.addEventListener("DOMContentLoaded", init);
