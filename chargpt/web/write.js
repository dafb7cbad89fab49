// chargpt playground, Write: text streamed from the run on screen (POST /api/generate), stopped on request, its
// unknown prompt characters marked and its copied spans shaded; a form, an acrostic, banned characters, a regular
// expression and best-of with each sample's scores under it; for a run trained on sentence pairs, a translation box
// that translates line by line; for a run trained with --labels, the label to write in and its guidance.
import {$, MIX, current, el, fmt, state, status, translates} from "./common.js";
import {api, generate} from "./api.js";
import {onAnalyse} from "./inside.js";
import {initSuggest} from "./suggest.js";

let showView;  // the page's view switch (main.js), for Look inside →

function unescapeStop(s) { return s.replace(/\\([ntr\\])/g, (_, c) => ({n: "\n", t: "\t", r: "\r", "\\": "\\"})[c]); }
function numberOrNull(id) { const v = $(id).value.trim(); return v === "" ? null : Number(v); }

export function clearWrite() {
  $("outputs").replaceChildren();
  delete $("outputs").dataset.novelty;
  $("prompt-marks").hidden = true;
  status("write-status", "");
  $("to-inside").disabled = true;
}

export function renderWriteMode() {
  // a run trained on sentence pairs turns Write into a translation box: source in, translation out (greedy by
  // default); Look inside reads one text, so an encoder-decoder (source and target apart) cannot use it
  const r = current(), pairs = translates(r), mode = pairs ? "translate" : "write";
  if (document.body.dataset.mode !== mode) {
    $("prompt").parentElement.firstChild.textContent = pairs ? "Sentence to translate" : "Prompt";
    $("prompt").placeholder = pairs ? "Type a sentence in the source language; its translation appears below"
      : "Type the start of a text, or leave it empty to begin a new paragraph";
    $("generate").textContent = pairs ? "Translate" : "Generate";
    $("temperature").value = pairs ? "0" : "0.8";  // translations: the most likely characters
    for (const label of document.querySelectorAll("#view-write .text-only")) label.hidden = pairs;  // text runs only
    document.body.dataset.mode = mode;
  }
  $("to-inside").hidden = Boolean(r && r.arch === "encoder-decoder");
  $("min-span").placeholder = String((r && r.novelty_min_span) || 20);  // the run's default, from its alphabet
  renderLabels(r);
}


function renderLabels(r) {
  // a run trained with --labels: its labels to write in ("(none)": unconditioned), rebuilt only when the run's
  // labels change (the choice stays when it still exists); Guidance shown only once a label is chosen
  const names = (r && Array.isArray(r.labels)) ? r.labels : [], pick = $("label");
  if (pick.dataset.names !== names.join("\n")) {
    const was = pick.value;
    pick.replaceChildren(el("option", {value: "", text: "(none)"}), ...names.map((n) => el("option", {value: n, text: n})),
                         ...(names.length > 1 ? [el("option", {value: MIX, text: "(mix)"})] : []));
    pick.value = names.includes(was) || (was === MIX && names.length > 1) ? was : "";
    pick.dataset.names = names.join("\n");
    // (mix): a slider per label, its weight from 0 (left out) to 100, shown beside it; all start equal
    $("mix-weights").replaceChildren(...names.map((n) => {
      const slider = el("input", {type: "range", min: "0", max: "100", step: "1", value: "50"}), shown = el("output", {text: "50"});
      slider.dataset.label = n;
      slider.setAttribute("aria-label", `weight of ${n}`);
      slider.addEventListener("input", () => { shown.textContent = slider.value; });
      return el("label", {}, n, " ", slider, " ", shown);
    }));
  }
  const mixing = pick.value === MIX;
  $("label-pick").hidden = !names.length;
  $("guidance-pick").hidden = !names.length || !pick.value || mixing;  // guidance steers towards one label
  $("mix-pick").hidden = !mixing;
  $("suffix-pick").hidden = !(r && r.fim);  // --fim: the text after the gap, the sample fills it
}

function mixSpec() {
  // the sliders as --label's mix, a:50,b:25 (the server normalises the weights); a weight of 0 leaves a label out
  const parts = [...$("mix-weights").querySelectorAll("input")].filter((s) => Number(s.value) > 0)
    .map((s) => `${s.dataset.label}:${s.value}`);
  return parts.length ? parts.join(",") : null;
}

function writeSettings() {
  // an empty box is left out: the server then uses sample.py's default for it
  const stop = $("stop").value, pairs = translates(current());
  const text = (id) => (pairs || $(id).value === "" ? null : $(id).value);  // constraints: text runs only
  const body = {run: state.run, prompt: $("prompt").value, temperature: numberOrNull("temperature"),
                top_k: numberOrNull("top-k"), top_p: numberOrNull("top-p"), max_new_tokens: numberOrNull("length"),
                seed: numberOrNull("seed"), num_samples: numberOrNull("samples"), unknown: $("unknown").value,
                stop: stop ? [unescapeStop(stop)] : [], form: text("form"), acrostic: text("acrostic"),
                ban: text("ban") === null ? null : unescapeStop(text("ban")), regex: text("regex"),
                best_of: pairs ? null : numberOrNull("best-of")};
  if (!$("label-pick").hidden && $("label").value === MIX) {  // --labels: a mix of styles, weighted
    const spec = mixSpec();
    if (spec !== null) body.label = spec;
  } else if (!$("label-pick").hidden && $("label").value) {  // --labels: the style to write in, and how strongly
    body.label = $("label").value;
    body.guidance = numberOrNull("guidance");
  }
  const beam = numberOrNull("beam");
  if (beam !== null) body.beam = beam;
  if (!$("suffix-pick").hidden && $("suffix").value) body.suffix = $("suffix").value;  // fill in the middle
  if (body.best_of !== null) body.min_span = numberOrNull("min-span");  // best-of's copy check: the box's span
  return Object.fromEntries(Object.entries(body).filter(([, v]) => v !== null));
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
    if (done.scores) showScores(done, nodes);
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
  // shade the spans of each sample that occur verbatim in the run's training text (chargpt.tools.novelty), the line
  // they come from in each one's tooltip, and the share copied under the sample
  $("outputs").dataset.novelty = "checking";
  const minSpan = numberOrNull("min-span") ?? Number($("min-span").placeholder);  // empty: the run's default
  for (let i = 0; i < texts.length; i++) {
    const box = nodes[i].box;
    let data;
    try { data = await api("/api/novelty", {run, text: texts[i], min_span: minSpan}); } catch (err) {
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

function showScores(done, nodes) {
  // under each sample: the model's own mean log-probability per character, and what the constraints removed
  done.scores.forEach((s, i) => {
    if (!nodes[i]) return;
    const parts = [s.logprob === null ? "no text" : `mean log-prob ${fmt(s.logprob)} nats/char`];
    if (s.removed !== undefined && s.removed !== null) {
      parts.push(`the constraints removed ${fmt(s.removed)} nats/char`);
    }
    if (s.best_of) parts.unshift(`best ${i + 1} of ${s.best_of} (row ${s.row})`);
    if (s.dropped) {
      const why = {copied: "copies the training text", repetitive: "repeats itself"}[s.dropped] || "a near-duplicate";
      parts.push(`${why}: ranked last`);
    }
    if (s.best_of && done.copy_check === false) {
      parts.push("copies not checked: the run's training text is not on this server");
    }
    nodes[i].box.append(el("p", {class: "scores hint", text: parts.join(" · ")}));
  });
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

export async function onStop() {
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

export function initWrite(views) {
  showView = views.showView;
  $("generate").addEventListener("click", onGenerate);
  $("stop-button").addEventListener("click", onStop);
  $("to-inside").addEventListener("click", toInside);
  $("label").addEventListener("change", () => renderLabels(current()));
  initSuggest();  // suggestions as a person types in the prompt box (suggest.js)
  $("prompt").addEventListener("keydown", (e) => { if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) onGenerate(); });
}
