// chargpt playground: what every view shares: the page's state, DOM helpers, number formats, the run on screen.
// Text is handled as code points (Array.from), as Python does.

export const $ = (id) => document.getElementById(id);
// what the page knows and shows; writeReq, insideReq, detailReq number the requests: an answer to one that is not
// the latest is stale and dropped
export const state = { runs: [], run: null, job: null, inside: null, layer: 0, head: 0, pinned: null,
                       plotted: new Set(), listed: new Set(), waiting: null, metrics: {}, unit: "bpc", poll: null,
                       colours: {}, writeReq: 0, insideReq: 0, detailReq: 0 };

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v; else if (k === "text") node.textContent = v; else node.setAttribute(k, v);
  }
  node.append(...children);
  return node;
}

export function svg(tag, attrs = {}) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  return node;
}

export function status(id, text, isError = false) {
  $(id).textContent = text;
  $(id).classList.toggle("error", isError);
}

export function fmt(x, digits = 3) { return x === null || x === undefined ? "–" : Number(x).toFixed(digits); }

export function params(n) {
  return n >= 1e6 ? `${(n / 1e6).toFixed(2)}M` : n >= 1e3 ? `${(n / 1e3).toFixed(1)}k` : String(n);
}

// the run picked in the header, and whether it translates (trained on sentence pairs)
export function current() { return state.runs.find((r) => r.name === state.run); }
export function translates(r) { return Boolean(r && r.task === "pairs"); }

// the Label picker's (mix) entry: no label is named so (a label's name never holds ⟨ or ⟩)
export const MIX = "⟨mix⟩";
