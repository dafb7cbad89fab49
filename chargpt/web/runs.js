// chargpt playground, Runs: the runs in the served folder, their loss curves drawn as SVG (following runs still
// training; a run trained with --labels adds each label's validation loss, dotted) against steps, training time
// or the share of each run's budget, and one run in full: vocabulary,
// lineage, a sample, the samples it wrote while training (newest first, in a box of bounded height), its configs.
import {$, current, el, fmt, params, state, status, svg} from "./common.js";
import {api, generate, withKey} from "./api.js";

const LN2 = Math.log(2);
const UNLIMITED = 1e12;  // max_iters of a run bounded by --max-time alone (config.UNLIMITED)
const VOCAB_SHOWN = 120;  // vocabulary characters shown before "show all"
let picker;  // the run picker (main.js): loadRuns() and selectRun(name)

function ago(seconds) {
  const s = Date.now() / 1000 - seconds;
  return s < 90 ? `${Math.max(0, Math.round(s))} s ago` : s < 5400 ? `${Math.round(s / 60)} min ago`
    : s < 172800 ? `${Math.round(s / 3600)} h ago` : new Date(seconds * 1000).toLocaleDateString();
}

export async function refreshRuns() {
  try {
    await picker.loadRuns();
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

export async function fetchMetrics(name) {
  if (!state.runs.some((r) => r.name === name)) { state.plotted.delete(name); return; }
  const known = state.metrics[name];
  const query = known && known.mtime ? `?since=${encodeURIComponent(known.mtime)}` : "";
  const data = await api(`/api/runs/${encodeURIComponent(name)}/metrics${query}`);
  if (!data.unchanged) state.metrics[name] = data;
}

export function paletteColour(i) {
  // the i-th colour of an endless palette: hues a golden angle apart (each new one falls in the widest gap left),
  // lightness in a cycle of three, so that 20 runs still get 20 colours told apart (a fixed list of 8 repeated)
  const hue = (i * 137.508) % 360, light = [40, 55, 32][i % 3];
  return `hsl(${hue.toFixed(1)}, 70%, ${light}%)`;
}

function colourOf(name) {
  // keyed to the run: a run keeps its colour when others appear or go; a run seen for the first time takes the
  // next colour of the palette, never one a run on the page has
  if (!state.colours[name]) state.colours[name] = paletteColour(Object.keys(state.colours).length);
  return state.colours[name];
}

export function renderRunsTable() {
  const rows = state.runs.map((r) => {
    const box = el("input", {type: "checkbox", "aria-label": `plot ${r.name}`});
    box.checked = state.plotted.has(r.name);
    box.addEventListener("change", async () => {
      if (box.checked) { state.plotted.add(r.name); await fetchMetrics(r.name); } else state.plotted.delete(r.name);
      drawChart();
    });
    const name = el("button", {class: "link", text: r.name, title: "show this run and use it in Write and Look inside"});
    name.addEventListener("click", () => picker.selectRun(r.name));
    const live = r.training;
    return el("tr", {class: r.name === state.run ? "current" : ""},
      el("td", {}, box), el("td", {}, el("span", {class: "swatch"}), name),
      el("td", {text: r.error ? "unreadable" : r.corpus}), el("td", {class: "num", text: r.error ? "" : params(r.params)}),
      el("td", {class: "num", text: r.error ? "" : String(r.step)}), el("td", {class: "num", text: fmt(r.best_val_loss, 4)}),
      el("td", {class: "num", text: fmt(r.best_bpc)}),
      el("td", {class: "num", text: fmt(r.best_bpb), title: "bits per UTF-8 byte: compares runs across alphabets"}),
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

const UNIT_NAMES = {bpc: "bits/char", bpb: "bits/byte", nats: "nats"};
const Y_LABELS = {bpc: "loss (bits per character)", bpb: "loss (bits per UTF-8 byte)", nats: "loss (nats)"};

function lossIn(unit, rows) {
  // (row, split) -> its loss in `unit`: bits per byte from *_bpb, or for the running loss (train_loss.jsonl has
  // nats only) from the run's bits per byte per nat of training loss (its evaluations say it); NaN where unknown
  const last = [...rows].reverse().find((r) => Number.isFinite(r.train_bpb) && r.train_loss > 0);
  const perNat = last ? last.train_bpb / last.train_loss : NaN;
  return (row, split) => {
    const nats = row[`${split}_loss`];
    if (unit === "nats") return nats ?? row[`${split}_bpc`] * LN2;
    if (unit === "bpc") return row[`${split}_bpc`] ?? nats / LN2;
    return row[`${split}_bpb`] ?? (nats ?? NaN) * perNat;
  };
}

const MAX_LABEL_CURVES = 20;  // per run: a run may have thousands of labels (--labels); the first 20 are drawn

function labelsOf(rows) {
  // a run trained with --labels: the labels its evaluations recorded a validation loss for (val_loss_by_label)
  const names = new Set();
  for (const r of rows) for (const k of Object.keys(r.val_loss_by_label || {})) names.add(k);
  return [...names].slice(0, MAX_LABEL_CURVES);
}

function labelLoss(unit) {
  // (row, label) -> that label's validation loss in `unit`; NaN in bits per byte (a label's own bytes per
  // character is not recorded, and the run's would be wrong for a label in another alphabet)
  return (row, label) => {
    const nats = (row.val_loss_by_label || {})[label];
    if (typeof nats !== "number" || unit === "bpb") return NaN;
    return unit === "nats" ? nats : nats / LN2;
  };
}

function xAxis(axis) {
  // the x of a metrics row for each choice: step; training time (elapsed_s, evaluation time left out); the share
  // of the run's budget spent: of --max-time, or of --max-iters, whichever ends the run first (the larger share)
  if (axis === "time") return {label: "training time (s)", of: (r) => r.elapsed_s};
  if (axis === "budget") {
    return {label: "share of the run's budget (%)", of: (r, run) => {
      const b = (run && run.budget) || {};
      const shares = [b.max_time > 0 ? r.elapsed_s / b.max_time : NaN,
                      b.max_iters > 0 && b.max_iters < UNLIMITED ? r.step / b.max_iters : NaN].filter(Number.isFinite);
      return shares.length ? 100 * Math.max(...shares) : NaN;
    }};
  }
  return {label: "step", of: (r) => r.step};
}

// the curves of the runs `names` into `box`, titled in `title`: the Runs view's chart, and New run's (train.js)
export function drawChart(box = $("chart"), names = state.plotted, title = $("chart-title")) {
  const unit = state.unit, axis = xAxis(state.xaxis || "steps");
  const series = [...names].filter((n) => state.metrics[n] && state.metrics[n].rows.length)
    .map((n) => ({name: n, rows: state.metrics[n].rows, running: state.metrics[n].running || [],
                  run: state.runs.find((r) => r.name === n)}))
    .map((s) => ({...s, value: lossIn(unit, s.rows), at: (r) => axis.of(r, s.run), labels: labelsOf(s.rows),
                  byLabel: labelLoss(unit)}));
  title.textContent = chartTitle(series.map((s) => s.name));
  if (!series.length) {
    box.textContent = "No evaluations logged yet for the runs ticked above (metrics.jsonl gets a line per evaluation).";
    box.dataset.curves = "0";
    return;
  }
  const points = series.flatMap((s) => [...s.rows.flatMap((r) => [s.value(r, "train"), s.value(r, "val")]),
                                        ...s.running.map((r) => s.value(r, "train")),
                                        ...s.labels.flatMap((l) => s.rows.map((r) => s.byLabel(r, l)))])
    .filter((v) => Number.isFinite(v));
  const xs = series.flatMap((s) => [...s.rows, ...s.running].map(s.at)).filter((v) => Number.isFinite(v));
  if (!points.length) {
    box.textContent = `No loss in ${UNIT_NAMES[unit]} for the runs ticked above (bits per byte: runs trained before ` +
      "chargpt recorded it, and sentence-pair runs, have none).";
    box.dataset.curves = "0";
    return;
  }
  const [W, H, L, R, T, B] = [760, 340, 56, 16, 12, 40];
  const xmax = Math.max(1e-9, ...xs), ylo = Math.min(...points), yhi = Math.max(...points);
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
  xlabel.textContent = axis.label;
  const ylabel = svg("text", {x: 14, y: (T + H - B) / 2, "text-anchor": "middle", transform: `rotate(-90 14 ${(T + H - B) / 2})`});
  ylabel.textContent = Y_LABELS[unit];
  root.append(xlabel, ylabel);
  let curves = 0, labelled = 0;
  for (const s of series) {
    const colour = colourOf(s.name), value = s.value;
    const dense = s.running.filter((r) => Number.isFinite(value(r, "train")) && Number.isFinite(s.at(r)));
    if (dense.length) {  // the running training loss, every few steps: thin, under the evaluated curves
      const d = dense.map((r, i) => `${i ? "L" : "M"}${x(s.at(r)).toFixed(1)},${y(value(r, "train")).toFixed(1)}`).join("");
      root.append(svg("path", {class: "curve running", d, fill: "none", stroke: colour, "stroke-width": 1,
                               "stroke-opacity": 0.4, "data-run": s.name}));
    }
    labelled += drawLabels(root, s, colour, x, y, unit);  // under the run's own curves
    for (const split of ["train", "val"]) {
      const rows = s.rows.filter((r) => Number.isFinite(value(r, split)) && Number.isFinite(s.at(r)));
      if (!rows.length) continue;
      const d = rows.map((r, i) => `${i ? "L" : "M"}${x(s.at(r)).toFixed(1)},${y(value(r, split)).toFixed(1)}`).join("");
      root.append(svg("path", {class: `curve ${split}`, d, fill: "none", stroke: colour, "stroke-width": split === "val" ? 2 : 1.5,
                               "stroke-dasharray": split === "val" ? "" : "5 4", "data-run": s.name}));
      curves++;
      if (split === "val") {
        for (const r of rows) {
          const dot = svg("circle", {cx: x(s.at(r)), cy: y(value(r, split)), r: 2.5, fill: colour});
          const tip = svg("title");
          const each = s.labels.filter((l) => Number.isFinite(s.byLabel(r, l)))
            .map((l) => `${l} ${fmt(s.byLabel(r, l))}`).join(", ");
          tip.textContent = `${s.name}, step ${r.step} (${fmt(r.elapsed_s, 1)} s): val ${fmt(value(r, "val"))}, ` +
            `train ${fmt(value(r, "train"))} ${UNIT_NAMES[unit]}` + (each ? `; val by label: ${each}` : "");
          dot.append(tip);
          root.append(dot);
        }
      }
    }
  }
  box.replaceChildren(root);
  box.dataset.curves = String(curves);
  box.dataset.labelCurves = String(labelled);
}

function drawLabels(root, s, colour, x, y, unit) {
  // each label's validation loss (--labels): a thin dotted line in the run's colour, named at its last point
  let drawn = 0;
  for (const label of s.labels) {
    const rows = s.rows.filter((r) => Number.isFinite(s.byLabel(r, label)) && Number.isFinite(s.at(r)));
    if (!rows.length) continue;
    const d = rows.map((r, i) => `${i ? "L" : "M"}${x(s.at(r)).toFixed(1)},${y(s.byLabel(r, label)).toFixed(1)}`).join("");
    const last = rows[rows.length - 1];
    const tip = `${s.name}, label ${label}: val ${fmt(s.byLabel(last, label))} ${UNIT_NAMES[unit]} at step ${last.step}`;
    const path = svg("path", {class: "label-curve", d, fill: "none", stroke: colour, "stroke-width": 1.2,
                              "stroke-dasharray": "1 3", "stroke-linecap": "round", "data-run": s.name,
                              "data-label": label});
    const name = svg("text", {class: "label-name", x: x(s.at(last)) - 4, y: y(s.byLabel(last, label)) - 4,
                              "text-anchor": "end", fill: colour, "font-size": 10, "data-label": label});
    name.textContent = label.length > 16 ? `${label.slice(0, 15)}…` : label;
    for (const node of [path, name]) {
      const title = svg("title");
      title.textContent = tip;
      node.append(title);
      root.append(node);
    }
    drawn++;
  }
  return drawn;
}

async function fetchDetail() {
  // -> the selected run's details, or null when another run was selected (or asked for) meanwhile
  const name = state.run, req = ++state.detailReq;
  const r = await api(`/api/runs/${encodeURIComponent(name)}`);
  return req === state.detailReq && name === state.run ? r : null;
}

function duringTraining(r) {
  // what it wrote while training (--sample-every): the same prompt and seed each time, so the model learning shows.
  // Newest first, in a box of bounded height that scrolls (and folds away): a run's page stays a page long
  const during = (r.samples || []).slice().reverse().map((s) => el("div", {class: "sample during"},
    el("h3", {text: `step ${s.step}`}),
    el("pre", {}, el("span", {class: "prompt", text: String(s.prompt ?? "")}), el("span", {class: "gen", text: String(s.text ?? "")}))));
  if (!during.length) return [];
  const open = $("run-samples") && $("run-samples").querySelector("details");
  const box = el("details", {class: "during-list"},
    el("summary", {text: `Samples while training (${during.length}), newest first`}),
    el("div", {class: "during-scroll"}, ...during));
  box.open = open ? open.open : true;  // as the person left it when new samples arrive
  return [box];
}

async function refreshSamples() {
  const box = $("run-detail");
  box.dataset.updated = String((current() || {}).updated);  // asked once per change
  const r = await fetchDetail().catch(() => null);
  if (!r || r.error || box.dataset.run !== r.name) return;
  $("run-samples").replaceChildren(...duringTraining(r));
  $("run-saved").textContent = `saved ${r.saved_at || "?"} · corpus ${r.corpus}`;
}

export async function showRunDetail() {
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
  // a long table (the training config's 40-odd settings) takes two grid columns and flows its rows in two
  const table = (title, obj) => el("div", {class: Object.keys(obj || {}).length > 20 ? "long" : ""},
    el("h3", {text: title}), el("table", {},
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
    reportLink(r),
    vocabSummary(Array.isArray(r.vocab_chars) ? r.vocab_chars : Array.from(r.vocab_preview || ""), r.vocab_size),
    ...lineage(r),
    el("h3", {text: "Sample"}), note, button, el("div", {class: "sample"}, out),
    el("div", {id: "run-samples"}, ...duringTraining(r)),
    el("div", {class: "config"}, table("Model", r.model_config), table("Training", tc), table("Files", files)));
}

// its report card (chargpt report RUN), opened in a new tab: fetched with the key the page holds, so a served
// folder that asks for one shows it too
function reportLink(r) {
  if (!r.report) return el("p", {class: "hint", text: `no report card yet: chargpt report ${r.name} writes one`});
  const address = `/api/runs/${encodeURIComponent(r.name)}/report`;
  // without a key the page opens at its own address, under its own policy (its inline style); with one it is
  // fetched with the key and shown from memory (the playground's policy then holds, and its style may not apply)
  if (!withKey().Authorization) {
    return el("p", {}, el("a", {href: address, target: "_blank", rel: "noopener", id: "run-report", text: "Report card"}));
  }
  const button = el("button", {type: "button", id: "run-report", text: "Report card"});
  const said = el("span", {class: "status"});
  button.addEventListener("click", async () => {
    const tab = window.open("", "_blank");
    const response = await fetch(address, {headers: withKey()});
    if (!response.ok) {
      if (tab) tab.close();
      said.textContent = (await response.json().catch(() => ({}))).error || response.statusText;
      said.classList.add("error");
      return;
    }
    const url = URL.createObjectURL(new Blob([await response.text()], {type: "text/html"}));
    if (tab) tab.location = url; else window.location.assign(url);
  });
  return el("p", {}, button, " ", said);
}

// the run this one started from (train --init-from RUN), as chargpt info shows it; nothing for a run from scratch
function lineage(r) {
  const b = r.init_from;
  if (!b) return [];
  const val = typeof b.val_loss === "number" ? `, val loss ${fmt(b.val_loss, 4)}` : "";
  return [el("p", {class: "hint lineage", text: `started from ${b.path} (${b.weights || "?"} weights, step ` +
    `${b.step ?? 0} on ${b.corpus || "?"}${val}); ${(b.added_chars ?? 0).toLocaleString()} characters added to its vocabulary`})];
}

export function initRuns(runPicker) {
  picker = runPicker;
  document.querySelectorAll("input[name=unit]").forEach((r) => r.addEventListener("change", () => {
    state.unit = r.value;
    drawChart();
  }));
  document.querySelectorAll("input[name=xaxis]").forEach((r) => r.addEventListener("change", () => {
    state.xaxis = r.value;
    drawChart();
  }));
}
