/* The exported page: reads the model embedded above it, wires the controls, and offers window.chargpt:

    await chargpt.ready;                                         // the model is loaded
    await chargpt.generate("ROMEO:", {maxNewTokens: 200, temperature: 0.8, seed: 1})   // -> the text written
    await chargpt.stream("ROMEO:", {topK: 20}, (piece) => console.log(piece))          // piece by piece, then the text
    await chargpt.generate("", {form: "五言绝句", acrostic: "春夏秋冬"})                 // sample.py's constraints
    chargpt.stop()                                               // ends what is being written
    chargpt.info                                                 // the run: name, corpus, size, validation loss,
                                                                 // its named forms and its labels

Options: maxNewTokens, temperature (0: greedy), topK (0: off), topP (1: off), seed (the same seed writes the same
text here), stop (strings that end the text, not included), stopAtBlankLine, unknown ("error", "skip", "replace":
prompt characters the model never saw), signal (an AbortSignal), form, acrostic, ban, allow, minP, repetitionPenalty,
noRepeatNgram (as sample.py's --form, --acrostic, --ban, --allow, --min-p, --repetition-penalty, --no-repeat-ngram),
label and guidance (a run trained with --labels). A bad call is refused before anything
is written, with an Error naming what to change. Writing runs on the page's own thread, in slices of a few tens of
milliseconds, so Stop and the text on screen keep up.
*/
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  const body = document.body;
  let gen = null, running = null;

  function say(text, state) {
    $("status").textContent = text;
    if (state) body.dataset.state = state;
  }

  function describe(info) {
    const facts = [];
    if (info.corpus) facts.push(`trained on ${info.corpus}`);
    facts.push(`${info.size}, ${Number(info.params).toLocaleString("en")} parameters`);
    if (typeof info.val_loss === "number") {
      facts.push(`validation loss ${info.val_loss.toFixed(4)} nats per character (${(info.val_loss / Math.LN2).toFixed(3)} bits)`);
    }
    if (info.step !== null && info.step !== undefined) facts.push(`${Number(info.step).toLocaleString("en")} steps`);
    facts.push(`${info.weights} weights`);
    return facts.join("; ");
  }

  /** The named forms this model can write (its vocabulary holds their fixed characters and some text). */
  function namedForms(description) {
    const all = new Uint8Array(description.chars.length).fill(1), forms = description.forms;
    return Object.keys(forms.shapes).filter((name) => {
      try {
        return chargptSampling.compile(name, null, gen.vocab, all, "", forms) !== null;
      } catch (e) {
        return false;
      }
    });
  }

  function choices(select, values, shown) {
    for (const v of values) select.add(new Option(shown(v), v));
  }

  function load() {
    const description = JSON.parse($("chargpt-model").textContent);
    const bytes = chargptDecoder.base64Bytes($("chargpt-weights").textContent.trim());
    gen = new chargptDecoder.Generator(description, bytes);
    const info = description.info, d = description.defaults;
    info.simd = gen.model.simd;  // whether the products run in WebAssembly SIMD (else the JavaScript loops, slower)
    info.forms = namedForms(description);
    info.labels = description.labels ? Object.keys(description.labels.names) : null;
    choices($("form"), info.forms, (name) => `${name}: ${description.forms.shapes[name][1]}`);
    $("form").add(new Option("a pattern of your own…", "pattern"));
    if (info.labels) {
      choices($("label"), info.labels, (name) => name);
      $("label-controls").hidden = false;
      $("guidance").value = d.guidance;
    }
    $("name").textContent = info.name;
    $("facts").textContent = describe(info);
    $("temperature").value = d.temperature;
    $("length").value = d.max_new_tokens;
    return info;
  }

  /** The controls -> generation options; throws naming a control that is not a number. */
  function options() {
    const read = (id, integer) => {
      const raw = $(id).value.trim();
      if (raw === "") return undefined;
      const v = Number(raw);
      if (!Number.isFinite(v) || (integer && !Number.isInteger(v))) throw new Error(`${id} must be a ${integer ? "whole " : ""}number`);
      return v;
    };
    let seed = read("seed", true);
    if (seed === undefined) seed = Math.floor(Math.random() * 1e9);  // shown afterwards: a good draw can be had again
    const text = (id) => $(id).value || undefined;
    const typed = (id) => text(id) && unescape(text(id));
    const form = $("form").value === "pattern" ? text("form-pattern") : text("form");
    const labelled = $("label-controls").hidden ? {} : {label: text("label"), guidance: read("guidance")};
    return {temperature: read("temperature"), topK: read("top-k", true) || 0, topP: read("top-p") ?? 1,
            maxNewTokens: read("length", true), seed, stopAtBlankLine: $("stop-blank").checked,
            form, acrostic: text("acrostic"), ban: typed("ban"), allow: typed("allow"), ...labelled};
  }

  /** \n, \t, \r and \\ typed in a field -> the characters, as sample.py's --ban and --allow read them. */
  function unescape(text) {
    return text.replace(/\\([ntr\\])/g, (_, c) => ({n: "\n", t: "\t", r: "\r", "\\": "\\"})[c]);
  }

  async function write() {
    if (running) return;
    const prompt = $("prompt").value;
    let opts;
    try {
      opts = options();
      gen.prepare(prompt, opts);  // a bad prompt or option is named before anything is cleared
    } catch (e) {
      say(e.message, "error");
      return;
    }
    const out = $("output"), shown = out.querySelector(".gen");
    out.querySelector(".prompt").textContent = prompt;
    shown.textContent = "";
    const node = shown.appendChild(document.createTextNode(""));
    running = new AbortController();
    $("generate").disabled = true;
    $("stop").disabled = false;
    say("writing…", "running");
    const t0 = performance.now();
    let first = null, count = 0;
    try {
      await gen.stream(prompt, {...opts, signal: running.signal}, (piece) => {
        if (first === null) first = performance.now() - t0;
        count += [...piece].length;
        node.appendData(piece);
      });
      const seconds = (performance.now() - t0) / 1000;
      const rate = count && seconds > 0 ? `, ${(count / seconds).toFixed(0)} characters/s` : "";
      const stopped = running.signal.aborted ? "stopped: " : "";  // (a stop() from a script aborts it too)
      say(`${stopped}${count} characters in ${seconds.toFixed(1)} s${rate}; seed ${opts.seed}`, "done");
      body.dataset.first = first === null ? "" : first.toFixed(0);
    } catch (e) {
      say(e.message, "error");
    } finally {
      running = null;
      $("generate").disabled = false;
      $("stop").disabled = true;
    }
  }

  function stop() {
    if (running) running.abort();
    if (gen) gen.stop();
  }

  let ready;
  window.chargpt = {
    ready: new Promise((resolve, reject) => { ready = {resolve, reject}; }),
    generate: (prompt, opts) => window.chargpt.ready.then(() => gen.generate(prompt, opts)),
    stream: (prompt, opts, onText) => window.chargpt.ready.then(() => gen.stream(prompt, opts, onText)),
    stop,
    info: null,
  };
  $("generate").addEventListener("click", write);
  $("form").addEventListener("change", () => { $("form-pattern").hidden = $("form").value !== "pattern"; });
  $("stop").addEventListener("click", stop);
  $("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) write();
  });
  setTimeout(() => {  // after the first paint: "loading the model…" shows while the weights are read
    try {
      window.chargpt.info = load();
      $("generate").disabled = false;
      say("ready", "idle");
      body.dataset.ready = "1";
      ready.resolve(window.chargpt.info);
    } catch (e) {
      say(`the model could not be loaded: ${e.message}`, "error");
      ready.reject(e);
    }
  }, 0);
})();
