/* The export's check of a written page, under node: the page's own decoder script, model and weights, read out of
the HTML file, write greedily after a prompt, and every step's logits are printed for chargpt to compare with its
own (chargpt/tools/webpage/check.py).

    node check.js PAGE.html REQUEST   ->  {"ids": [...], "logits": [[...], ...]} on stdout

REQUEST, JSON: {"prompt": "The ", "steps": 24}. Also used by the tests, with {"seed": ..., "temperature": ...}
to sample, "text": true to print the text alone ({"text": "...", "simd": whether WebAssembly SIMD computed it}),
and "simd": false for the plain JavaScript loops.
*/
"use strict";
const fs = require("fs");

function scriptText(html, mark) {
  const at = html.indexOf(mark);
  if (at < 0) throw new Error(`the page has no script ${mark}`);
  const start = html.indexOf(">", at) + 1, end = html.indexOf("</script>", start);
  return html.slice(start, end);
}

async function main() {
  const html = fs.readFileSync(process.argv[2], "utf8");
  const request = JSON.parse(process.argv[3]);
  const module = {exports: {}};
  new Function("module", scriptText(html, 'id="chargpt-decoder"'))(module);  // the page's decoder, as it is there
  const decoder = module.exports;
  const description = JSON.parse(scriptText(html, 'id="chargpt-model"'));
  if (request.simd === false) description.simd = false;  // the plain JavaScript loops instead of WebAssembly SIMD
  const gen = new decoder.Generator(description, decoder.base64Bytes(scriptText(html, 'id="chargpt-weights"').trim()));
  if (request.text) {
    const text = await gen.generate(request.prompt, request);
    process.stdout.write(JSON.stringify({text, simd: gen.model.simd}));
    return;
  }
  const ids = gen.encode(request.prompt, "error");
  const context = ids.length ? ids : gen.encode(description.start_text, "skip");
  const out = {ids: [], logits: []};
  const greedy = (logits) => { out.logits.push(Array.from(logits)); return decoder.argmax(logits); };
  for (const id of gen.ids(context, request.steps, greedy)) out.ids.push(id);
  process.stdout.write(JSON.stringify(out));
}

main().catch((e) => {
  process.stderr.write(`${e.message}\n`);
  process.exit(1);
});
