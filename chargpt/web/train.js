// chargpt playground, New run: train a run from the page (the API of chargpt/web/endpoints/train.py). Choose a text
// (a file from this computer, uploaded as it is; a file or a folder of texts from the server's data folder, a folder
// with its labels choice; or the built-in corpus), a time budget, optionally a preset or a size; Start. While it trains, polled every POLL_MS while the view is shown: what
// the start-up chose, the loss curves (the Runs view's chart: runs.js), speed, time left, the samples as they are
// written and the last lines; Stop (it saves), Resume, and Write with the run once it has a checkpoint.
import {$, el, state, status} from "./common.js";
import {api, withKey} from "./api.js";
import {drawChart, fetchMetrics} from "./runs.js";

const POLL_MS = 1500;
let main;  // main.js: loadRuns(), selectRun(name), showView(view)
let shown = false, timer = null, pollId = 0, last = null, limits = {max_upload_bytes: 0}, off = false;

const listed = (name) => state.runs.some((r) => r.name === name);
const live = (t) => Boolean(t && (t.state === "running" || t.state === "stopping"));

function megabytes(n) {  // 812 B, 4.9 kB, 20.0 MB: never "0.00 MB" for a short text
  return n < 1000 ? `${n} B` : n < 2 ** 20 ? `${(n / 1000).toFixed(1)} kB` : `${(n / 2 ** 20).toFixed(1)} MB`;
}

function duration(s) {
  s = Math.max(0, Math.round(s));
  if (s >= 7200) return `${(s / 3600).toFixed(1)} h`;
  return s < 120 ? `${s} s` : `${Math.floor(s / 60)} min` + (s % 60 ? ` ${s % 60} s` : "");
}

let labelChoices = {};  // "data:FOLDER" -> the labels choices the server listed for that folder of texts
const LABEL_WORDS = {none: "none: one text", folders: "by subfolder (folders)", files: "by file (files)"};

async function loadCorpora(pick) {
  // the texts by name (never by path): the built-in corpus, the data folder's texts and folders of texts, the
  // uploaded ones
  const c = await api("/api/corpora");
  const option = (source, f, where) => el("option", {value: `${source}:${f.name}`, text: f.kind === "folder"
    ? `${f.name}/ (${where}, a folder of ${f.files} texts, ${megabytes(f.bytes)})`
    : `${f.name} (${where}, ${megabytes(f.bytes)})`});
  const options = [el("option", {value: "builtin:", text: `built-in: ${c.builtin} (Python's help topics)`}),
    ...c.uploads.map((f) => option("upload", f, "uploaded")), ...c.data.map((f) => option("data", f, "data folder"))];
  labelChoices = Object.fromEntries(c.data.filter((f) => f.kind === "folder").map((f) => [`data:${f.name}`, f.labels]));
  const keep = pick || $("train-corpus").value;
  $("train-corpus").replaceChildren(...options);
  if (options.some((o) => o.value === keep)) $("train-corpus").value = keep;
  showLabels();
}

function showLabels() {
  // a folder of texts offers its own labels choices (a manifest: one of its .tsv files); a single text offers them
  // all, and the server says why a single text cannot have labels
  const choices = labelChoices[$("train-corpus").value] || ["none", "folders", "files"], keep = $("train-labels").value;
  $("train-labels").replaceChildren(...choices.map((c) => el("option", {value: c,
    text: LABEL_WORDS[c] || `from the manifest ${c}`})));
  $("train-labels").value = choices.includes(keep) ? keep : "none";
}

async function upload() {
  // the file's bytes as they are: the server checks they are UTF-8 before keeping them
  const file = $("train-file").files[0];
  if (!file) return;
  if (file.size > limits.max_upload_bytes) {
    status("train-status", `${file.name} is ${megabytes(file.size)}; the limit is ${megabytes(limits.max_upload_bytes)}`, true);
    return;
  }
  status("train-status", `uploading ${file.name}…`);
  try {
    const response = await fetch(`/api/train/upload?name=${encodeURIComponent(file.name)}`,
      {method: "POST", headers: withKey({"Content-Type": "application/octet-stream"}), body: file});
    const data = await response.json().catch(() => ({error: `${response.status} ${response.statusText}`}));
    if (!response.ok) throw new Error(data.error);
    await loadCorpora(`upload:${data.corpus}`);
    status("train-status", `uploaded ${file.name} as ${data.corpus}; choose a time budget and press Start`);
  } catch (err) {
    status("train-status", err.message, true);
  } finally {
    $("train-file").value = "";
  }
}

function number(id) {
  const v = $(id).value.trim();
  return v === "" ? undefined : Number(v);
}

async function start() {
  const choice = $("train-corpus").value, cut = choice.indexOf(":");
  const source = choice.slice(0, cut), body = {source, max_time: number("train-time"),
    preset: $("train-preset").value || undefined, n_layer: number("train-layers"), n_embd: number("train-width"),
    sample_every: number("train-sample-every"), name: $("train-name").value.trim() || undefined};
  if ($("train-labels").value !== "none") body.labels = $("train-labels").value;
  if (source !== "builtin") body.corpus = choice.slice(cut + 1);
  await act("/api/train", body, "starting");
}

async function act(path, body, doing) {
  status("train-status", `${doing}…`);
  try {
    const data = await api(path, body);
    status("train-status", "");
    await render(data.training);
    if (data.message) status("train-status", data.message);  // a second Stop: it is already stopping
  } catch (err) {
    status("train-status", err.message, true);
  }
  poll();
}

function resume() {
  // the run goes on from its last save for the time budget above (a new budget: the learning rate decays afresh
  // from the rate it had reached), whether it was stopped or had finished
  return act("/api/train/resume", {run: last.run, max_time: number("train-time")}, `resuming ${last.run}`);
}

async function writeWith() {
  await main.loadRuns();
  main.selectRun(last.run);
  main.showView("write");
}

export function showTrain(visible) {
  shown = visible;
  clearTimeout(timer);
  if (visible && !off && document.querySelector(".tab[data-view=train]").hidden === false) poll();
}

async function poll() {
  // one chain of polls at a time: a newer one (after Start, Stop, Resume) replaces the one waiting
  const mine = ++pollId;
  clearTimeout(timer);
  try {
    await render((await api("/api/train")).training);
  } catch (err) {
    status("train-status", `cannot read the training: ${err.message}`, true);
  }
  if (shown && mine === pollId) timer = setTimeout(poll, POLL_MS);
}

function facts(t) {
  const p = t.progress || {}, parts = [`step ${(p.step || 0).toLocaleString("en")}`];
  if (p.chars_per_s) parts.push(`${Math.round(p.chars_per_s).toLocaleString("en")} characters/s`);
  if (live(t) && typeof p.left_s === "number") parts.push(`${duration(p.left_s)} left of ${duration(t.budget)}`);
  const words = {running: "training", stopping: "stopping: saving the run", finished: "finished",
                 stopped: "stopped and saved", abandoned: "stopped without its last save", crashed: `stopped with an error (exit code ${t.exit_code ?? "unknown"})`};
  return [el("span", {class: `train-state ${t.state}`, text: words[t.state] || t.state}), ` · ${parts.join(" · ")}`];
}

function sampleList(samples) {
  if (!samples.length) {
    return [el("p", {class: "hint", text: "None yet: a sample every so many steps (Sample every), from the same " +
      "prompt and seed each time, so the model's learning shows."})];
  }
  return samples.slice().reverse().map((s) => el("div", {class: "sample during"}, el("h3", {text: `step ${s.step}`}),
    el("pre", {}, el("span", {class: "prompt", text: String(s.prompt ?? "")}),
       el("span", {class: "gen", text: String(s.text ?? "")}))));
}

function said(t) {
  if (t.state === "crashed") return [t.error || t.log[t.log.length - 1] || "it ended without a word", true];
  if (t.state === "finished") return [`${t.run} is trained: Write with it, or Resume to train it for longer`, false];
  if (t.state === "stopped") return [`${t.run} is saved where it stopped: Resume trains it on`, false];
  if (t.state === "abandoned") {
    return [`${t.run} stopped before its save was written: the steps since its last complete save are lost; ` +
            "Resume trains it on from that save", true];
  }
  return ["", false];
}

async function render(t) {
  const before = last;
  last = t;
  document.body.dataset.training = t ? t.state : "none";
  $("train-start").disabled = live(t);
  $("train-stop").disabled = !t || t.state !== "running";
  $("train-resume").disabled = !t || !t.resumable;
  $("train-live").hidden = !t;
  if (!t) return;
  if (!before || before.run !== t.run) {
    $("train-chart").replaceChildren(el("p", {class: "hint", text: "The curves appear at the first evaluation."}));
    $("train-chart-title").textContent = "";
  }
  $("train-title").textContent = t.run;
  $("train-facts").replaceChildren(...facts(t));
  $("train-startup").textContent = t.startup.join("\n");
  $("train-startup-box").hidden = !t.startup.length;  // a start that failed at once said nothing yet
  const log = $("train-log"), atEnd = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
  log.textContent = t.log.join("\n");
  if (atEnd) log.scrollTop = log.scrollHeight;  // follows the end, unless scrolled up to read
  $("train-samples").replaceChildren(...sampleList(t.samples || []));
  const [message, isError] = said(t);
  if (message || !$("train-status").classList.contains("error")) status("train-status", message, isError);
  // the run joins the runs listing (Write, Look inside, Runs) with its first checkpoint; its curves are the Runs
  // view's, from the same endpoint
  if (!listed(t.run) || (before && before.state !== t.state)) await main.loadRuns();
  $("train-write").disabled = !listed(t.run) || live(t);
  if (listed(t.run)) {
    const seen = (state.metrics[t.run] || {}).mtime;
    await fetchMetrics(t.run);
    if (seen && state.metrics[t.run] && state.metrics[t.run].mtime !== seen) await main.loadRuns();  // its new step
    drawChart($("train-chart"), [t.run], $("train-chart-title"));
  }
}

export async function initTrain(mainView) {
  main = mainView;
  $("train-start").addEventListener("click", start);
  $("train-stop").addEventListener("click", () => act("/api/train/stop", {}, "stopping"));
  $("train-resume").addEventListener("click", resume);
  $("train-write").addEventListener("click", writeWith);
  $("train-file").addEventListener("change", upload);
  $("train-corpus").addEventListener("change", showLabels);
  let data;
  try {
    data = await api("/api/train");
  } catch (err) {
    // 403: this server does not train from the page. Under --no-training there is no New run tab; off by default
    // (a server reached over the network) the tab says so, and what allows it
    if (err.data && err.data.shown) {
      off = true;
      document.querySelector(".tab[data-view=train]").hidden = false;
      for (const id of ["train-start", "train-stop", "train-resume", "train-write", "train-file"]) $(id).disabled = true;
      status("train-status", err.message, true);
    }
    return;
  }
  limits = data;
  $("train-preset").replaceChildren(el("option", {value: "", text: "default (auto on a CPU: sized for the budget)"}),
    ...data.presets.map((p) => el("option", {value: p, text: p})));
  await loadCorpora().catch((err) => status("train-status", err.message, true));
  document.querySelector(".tab[data-view=train]").hidden = false;
  if (shown) poll(); else await render(data.training);
}
