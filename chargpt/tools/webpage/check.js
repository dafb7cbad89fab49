/* The export's check of a written page, under node: the page's own scripts (sampling.js, then decoder.js), model and
weights, read out of the HTML file, write greedily after a prompt, and every step's logits are printed for chargpt
to compare with its own (chargpt/tools/webpage/check.py).

    node check.js PAGE.html REQUEST   ->  {"ids": [...], "logits": [[...], ...]} on stdout

REQUEST, JSON: {"prompt": "The ", "steps": 24}. Also used by the tests: "text": true writes with the rest of the
request as the call's options ({"text": "...", "simd": whether WebAssembly SIMD computed it}); "masks": true writes
with them too, and prints what the constraints allowed before each character ({"context", "ids", "masks": [the
allowed ids, or null for all], "ended"}), with "forced": [ids] writing those instead of its own choices and
"logits": true adding the logits before the constraints ("raw": a labels run's guided, its labels masked) and
after them ("logits": what each choice was made from);
"simd": false for the plain JavaScript loops.
*/
"use strict";
const fs = require("fs");

function scriptText(html, mark) {
  const at = html.indexOf(mark);
  if (at < 0) throw new Error(`the page has no script ${mark}`);
  const start = html.indexOf(">", at) + 1, end = html.indexOf("</script>", start);
  return html.slice(start, end);
}

/** The page's scripts as it runs them: sampling.js, then decoder.js reading it. */
function loadDecoder(html) {
  const sampling = {exports: {}}, decoder = {exports: {}};
  new Function("module", scriptText(html, 'id="chargpt-sampling"'))(sampling);
  new Function("module", "chargptSampling", scriptText(html, 'id="chargpt-decoder"'))(decoder, sampling.exports);
  return decoder.exports;
}

/** Writes as Generator._run does, keeping what the constraints allowed at each step (and the logits). */
function masks(gen, decoder, prompt, options, forced, withLogits) {
  const call = gen.prepare(prompt, options), o = call.o;
  const steer = call.planned ? new decoder.sampling.Steer(call.planned, o.maxNewTokens, gen.model.V, call.steered) : null;
  const out = {context: call.contextText, ids: [], masks: [], ended: false};
  const kept = (logits) => Array.from(logits, (x) => (x === -Infinity ? null : x));  // JSON has no -Infinity
  if (withLogits) Object.assign(out, {raw: [], logits: []});
  const choose = (logits) => {
    if (withLogits) out.raw.push(kept(logits));
    if (steer) steer.apply(logits);
    if (withLogits) out.logits.push(kept(logits));
    const id = gen.sampler.choose(logits, o, call.rand);
    out.masks.push(steer && steer.last ? Array.from(steer.last.keys()).filter((i) => steer.last[i]) : null);
    return forced ? forced[out.ids.length] : id;
  };
  for (const id of gen.ids(call.context, o.maxNewTokens, choose, call.head, gen.never)) {
    out.ids.push(id);
    if (steer && steer.chose(id)) { out.ended = true; break; }
  }
  return out;
}

async function main() {
  const html = fs.readFileSync(process.argv[2], "utf8");
  const {prompt, steps, text, masks: wantMasks, simd, forced, logits, ...options} = JSON.parse(process.argv[3]);
  const decoder = loadDecoder(html);
  const description = JSON.parse(scriptText(html, 'id="chargpt-model"'));
  if (simd === false) description.simd = false;  // the plain JavaScript loops instead of WebAssembly SIMD
  const gen = new decoder.Generator(description, decoder.base64Bytes(scriptText(html, 'id="chargpt-weights"').trim()));
  if (text) {
    process.stdout.write(JSON.stringify({text: await gen.generate(prompt, options), simd: gen.model.simd}));
    return;
  }
  if (wantMasks) {
    process.stdout.write(JSON.stringify(masks(gen, decoder, prompt, options, forced, logits)));
    return;
  }
  const ids = gen.encode(prompt, "error");
  const context = ids.length ? ids : gen.encode(description.start_text, "skip");
  const out = {ids: [], logits: []};
  const greedy = (logits) => { out.logits.push(Array.from(logits)); return decoder.argmax(logits); };
  for (const id of gen.ids(context, steps, greedy)) out.ids.push(id);
  process.stdout.write(JSON.stringify(out));
}

if (require.main === module) {
  main().catch((e) => {
    process.stderr.write(`${e.message}\n`);
    process.exit(1);
  });
}
module.exports = {scriptText, loadDecoder};  // for the tests' own scripts
