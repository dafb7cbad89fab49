// chargpt playground, Write: suggestions as a person types in the prompt box (POST /api/suggest): the likeliest word
// completions and next characters after the text before the caret, with their probabilities, as chips; a click on
// one, or Tab for the first, adds it at the caret. Asked once typing pauses, one request at a time; a reply to a text
// that has changed since is dropped.
import {$, MIX, current, el, state, translates} from "./common.js";
import {api} from "./api.js";

const PAUSE_MS = 150;  // after the last keystroke: one request per pause in typing, not one per key
const K = 5, WORDS = 3;  // next characters and completions shown
let timer = null, inFlight = false, again = false, asked = 0;
let shown = null;  // {at, text}: where the chips on screen apply (null while they are for an older text)
let tabbed = false;  // Tab was pressed before the chips for this text came: the first one is added when they come

function wanted() { return $("suggest").checked && Boolean(state.run) && !translates(current()); }

function visible(c) { return c === " " ? "␣" : c === "\n" ? "↵" : c === "\t" ? "⇥" : c; }

function percent(p) { return p >= 0.1 ? `${Math.round(p * 100)}%` : p >= 0.001 ? `${(p * 100).toFixed(1)}%` : "<0.1%"; }

export function clearSuggestions() {
  shown = null;
  $("suggestions").replaceChildren();
  $("suggestions").hidden = true;
  delete $("suggestions").dataset.ms;
  delete $("suggestions").dataset.for;
}

function schedule() {
  clearTimeout(timer);
  asked++;  // a reply to any earlier text is stale from now on
  shown = null;  // the chips stay on screen, dimmed, until the new ones come (no flicker at every key)
  tabbed = false;
  delete $("suggestions").dataset.for;
  if (!wanted()) { clearSuggestions(); return; }
  timer = setTimeout(ask, PAUSE_MS);
}

async function ask() {
  if (inFlight) { again = true; return; }  // the newest text goes once this reply is in
  const box = $("prompt"), at = box.selectionEnd, text = box.value.slice(0, at), run = state.run, mine = asked;
  const body = {run, text, k: K, words: WORDS, unknown: $("unknown").value};
  const label = $("label").value;  // a mix of labels: suggestions unconditioned (they follow one label's style)
  if (!$("label-pick").hidden && label && label !== MIX) body.label = label;
  inFlight = true;
  try {
    const data = await api("/api/suggest", body);
    if (mine === asked && run === state.run) show(data, at, text);
  } catch (err) {
    if (mine === asked) {  // an unknown character, a busy server: said quietly where the chips were
      clearSuggestions();
      $("suggestions").append(el("span", {class: "hint", text: `no suggestions: ${err.message}`}));
      $("suggestions").hidden = false;
    }
  } finally {
    inFlight = false;
    if (again) { again = false; ask(); }
  }
}

function chip(kind, add, label, p, title) {
  const b = el("button", {type: "button", class: `chip ${kind}`, "data-add": add, title}, label,
               el("span", {class: "p", text: percent(p)}));
  b.addEventListener("mousedown", (e) => e.preventDefault());  // the prompt box keeps the focus and its caret
  b.addEventListener("click", () => accept(add));
  return b;
}

function show(data, at, text) {
  shown = {at, text};
  const words = data.words.map((w) => {
    const typed = Array.from(w.word).slice(0, Array.from(w.word).length - Array.from(w.text).length).join("");
    return chip("word", w.text, el("span", {}, el("span", {class: "typed", text: typed}), w.text), w.p,
                `add “${w.text}”: ${data.kind === "cjk" ? "these characters" : "the word"} ${w.word}, probability ` +
                `${w.p.toPrecision(3)}`);
  });
  const chars = data.chars.map((c) => chip("char", c.char, visible(c.char), c.p,
                                           `the next character ${JSON.stringify(c.char)}, probability ${c.p.toPrecision(3)}`));
  const row = (name, chips) => el("div", {class: "suggest-row"}, el("span", {class: "hint", text: name}), ...chips);
  $("suggestions").replaceChildren(...(words.length ? [row(data.kind === "cjk" ? "Continue" : "Words", words)] : []),
                                   row("Next", chars));
  const first = $("suggestions").querySelector(".chip");  // what Tab adds
  if (first) first.classList.add("first");
  $("suggestions").dataset.ms = String(data.ms);
  $("suggestions").dataset.for = text;
  $("suggestions").title = `suggested in ${Math.round(data.ms)} ms · Tab adds the first`;
  $("suggestions").hidden = false;
  if (tabbed && first) accept(first.dataset.add);
}

function accept(add) {
  const box = $("prompt");
  if (!shown || box.selectionEnd !== shown.at || box.value.slice(0, shown.at) !== shown.text) {
    schedule();  // the text or the caret moved on: these chips are not for it
    return;
  }
  box.setRangeText(add, shown.at, shown.at, "end");
  box.focus();
  schedule();
}

export function initSuggest() {
  const box = $("prompt");
  box.addEventListener("input", schedule);
  box.addEventListener("click", schedule);  // the caret moved: suggest for the text before it
  box.addEventListener("keyup", (e) => { if (/^(Arrow|Home|End|Page)/.test(e.key)) schedule(); });
  box.addEventListener("keydown", (e) => {
    if (e.key !== "Tab" || e.shiftKey || e.ctrlKey || e.altKey || e.metaKey || !wanted()) return;
    const first = $("suggestions").querySelector(".chip");
    if (!first) return;  // no suggestions on screen: Tab leaves the box as usual
    e.preventDefault();  // Tab takes the first suggestion instead of leaving the box
    if (shown) accept(first.dataset.add); else tabbed = true;  // chips for an older text: the coming ones
  });
  for (const id of ["suggest", "run", "unknown", "label"]) $(id).addEventListener("change", schedule);
}
