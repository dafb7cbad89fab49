// chargpt playground: the page's entry module. Plain JavaScript modules, no build step, no libraries. Four views
// over the JSON API of chargpt/web/server.py, one module each: Write (write.js), Look inside (inside.js), Runs
// (runs.js), New run (train.js); this one holds the view switch and the run picker, and wires them together. A new view is a module
// with its init function, called from init() below, and a tab and a section (id view-NAME) in index.html.
import {$, current, el, fmt, params, state, translates} from "./common.js";
import {api} from "./api.js";
import {clearWrite, initWrite, onStop, renderWriteMode} from "./write.js";
import {clearInside, initInside} from "./inside.js";
import {initRuns, refreshRuns, renderRunsTable, showRunDetail} from "./runs.js";
import {initTrain, showTrain} from "./train.js";

function showView(view) {
  document.body.dataset.view = view;
  for (const tab of document.querySelectorAll(".tab")) $(`view-${tab.dataset.view}`).hidden = tab.dataset.view !== view;
  clearInterval(state.poll);
  if (view === "runs") {
    refreshRuns();
    state.poll = setInterval(refreshRuns, 3000);  // runs still training update live
  }
  showTrain(view === "train");  // New run polls its training while it is shown
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
  const here = document.querySelector(".tab[data-view=train]").hidden ? "" : " or in New run";  // training on
  $("no-runs").textContent = `No trained runs in ${data.folder} yet. Train one with: python train.py${here} ` +
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

function selectRun(name) {
  if (name !== state.run) forgetOutputs();
  state.run = name;
  $("run").value = name;
  renderFacts();
  renderWriteMode();
  if (document.body.dataset.view === "runs") { renderRunsTable(); showRunDetail(); }
}

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

function renderFacts() {
  const r = current();
  const kind = translates(r) ? `translation (${r.arch}) · ` : "";
  $("run-facts").textContent = !r ? "" : r.error ? `this run cannot be read: ${r.error}` :
    `${r.name} · corpus ${r.corpus} · ${kind}${params(r.params)} parameters (${r.layers} layer${r.layers === 1 ? "" : "s"} × ${r.width}, ` +
    `${r.heads} heads, context ${r.block_size}) · step ${r.step} · best val loss ${fmt(r.best_val_loss)} nats ` +
    `(${fmt(r.best_bpc)} bits/char) · ${r.vocab_size} characters`;
}

function init() {
  document.querySelectorAll(".tab").forEach((b) => b.addEventListener("click", () => showView(b.dataset.view)));
  $("run").addEventListener("change", () => selectRun($("run").value));
  initWrite({showView});
  initInside();
  initRuns({loadRuns, selectRun});
  initTrain({loadRuns, selectRun, showView});
  loadRuns().then(() => { document.body.dataset.ready = "1"; })
    .catch((err) => { $("no-runs").hidden = false; $("no-runs").textContent = `cannot reach the server: ${err.message}`; });
}

document.addEventListener("DOMContentLoaded", init);
