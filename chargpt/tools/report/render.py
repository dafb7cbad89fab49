"""A report (the dict of chargpt.tools.report.build_report) as Markdown and as one self-contained HTML page: its
style inline, the loss curve a data: URI, no script and nothing fetched, so it opens offline and anywhere. Every
text from the run (its corpus name, paths, samples) is escaped."""

import html

MD_SAMPLE_CHARS = 400  # of each temperature's first sample shown


def _n(x, digits=3, pct=False):
    if x is None:
        return "–"
    return f"{x:.{digits}%}" if pct else f"{x:,.{digits}f}"


def _pm(x, se, digits=3):
    return _n(x, digits) + (f" ± {se:.{digits}f}" if se is not None else "")


def _kl(x):
    return f"{x:.5f}" if x >= 1e-5 or x == 0 else f"{x:.1e}"


def _duration(s):
    return "?" if s is None else f"{s / 60:.1f} min" if s >= 60 else f"{s:.1f} s"


def sections(r):
    """The report as [(heading, [paragraph or table]), ...]: a table is a list of rows, its first the header."""
    run, c, s, p = r["run"], r["compression"], r["samples"], r["precision"]
    trained = ", ".join(f"{k} {v}" for k, v in (run["trained_on"] or {}).items()) or "not recorded"
    facts = [["", ""],
             ["corpus", f"{run['corpus']} ({run['data']}): {run['characters']:,} characters, an alphabet of "
                        f"{run['alphabet']:,}; {run['split']}: {run['train_chars']:,} train, {run['val_chars']:,} "
                        f"validation characters"],
             ["model", f"{run['model']}: {run['parameters']:,} parameters"],
             ["training", f"{run['steps']:,} steps in {_duration(run['training_time_s'])}; "
                          + (f"{run['characters_seen']:,} characters seen, {run['passes']:.1f} passes over the "
                             f"training text" if run["passes"] else "characters seen not recorded")],
             ["trained on", trained],
             ["this report", f"chargpt {run['chargpt']}, torch {run['torch']}, on {run['machine']}; "
                             f"took {_duration(r.get('took_s'))}"],
             ["trains it again", f"`{run['reproduce']}`" if run["reproduce"] else "no config.toml in the run"]]
    best = min(c["compressors"].values(), key=lambda x: x["bytes"])
    best_name = next(k for k, v in c["compressors"].items() if v is best)
    comp = [["coder", "bits/byte", "bits/char", "size", "how"],
            ["this model", _pm(c["bpb"], c["bpb_se"]), _pm(c["bpc"], c["bpc_se"]),
             f"{c['scored_bytes'] * c['bpb'] / 8:,.0f} bytes" if c["bpb"] else "–",
             f"loss {_pm(c['loss'], c['loss_se'], 4)} nats/char over {c['scored']:,} characters, windows of "
             f"{c['block_size']} every {c['block_size'] // 2 or 1}; ± one standard error over {c['windows']:,} "
             f"windows"]]
    comp += [[name, _n(x["bpb"]), _n(x["bpc"]), f"{x['bytes']:,} bytes", x["setting"]]
             for name, x in c["compressors"].items()]
    whole = "" if c["chars"] == c["val_chars"] else f" (the first {c['chars']:,} of its {c['val_chars']:,} characters)"
    lead = (f"This model codes its validation text{whole} in {_n(c['bpb'])} bits a byte; {best_name} needs "
            f"{_n(best['bpb'])}. Measured on the same {c['bytes']:,} UTF-8 bytes: the compressors at their "
            f"strongest settings (sizes with their headers); the model's loss, as chargpt eval scores it, over every "
            f"character but each stretch's first." + ("" if c["zstd"] else " zstd: not installed (pip install "
                                                     "zstandard), not measured."))
    unit = s["unit"]
    table = [["temperature", "log-prob/char", "distinct-1", "distinct-2", "distinct-3", "distinct-4", "self-BLEU",
              "copied", "longest copied", f"repeated {unit} 4-grams"]]
    for row in s["rows"]:
        d = row["distinct"]
        table.append([f"{row['temperature']:g}" + (" (suggested)" if row["temperature"] == s["suggested"] else ""),
                      _n(row["logprob"]), *(_n(d[n]) for n in (1, 2, 3, 4)), _n(row["self_bleu"], 1),
                      _n(row["copied_fraction"], 1, pct=True),
                      "–" if row["longest_copied"] is None else f"{row['longest_copied']} chars",
                      _n(row["repetition"], 1, pct=True)])
    span = next((row.get("min_span") for row in s["rows"] if row.get("min_span")), None)
    how = (f"{s['samples']} samples of {s['chars']:,} characters at each temperature, seed {s['seed']}, from an empty "
           f"prompt. log-prob/char: mean natural log-probability of the samples' characters under the model at "
           f"temperature 1. distinct-n: distinct {unit} n-grams over all n-grams of the samples. self-BLEU: "
           f"sacrebleu's sentence BLEU of each sample against the others, averaged (higher: more alike). copied: the "
           f"share of characters inside spans of {span or 'min-span'}+ characters found verbatim in the training text "
           f"(chargpt novelty). Repeated 4-grams: per sample, the share of its {unit} 4-grams that occurred earlier "
           f"in it (seq-rep-4).")
    notes = [n for n in (s["self_bleu_note"], s["novelty_note"]) if n]
    suggestion = (f"Suggested temperature: {s['suggested']:g}, {s['reason']}. The rule: {s['rule']}."
                  if s["suggested"] is not None else f"No temperature suggested: {s['reason']}.")
    prec = [["model", "KL from float32 (nats/char)", "top-1 agreement", "decode chars/s", "how"]]
    for row in p["rows"]:
        if "note" in row:
            prec.append([row["name"], "–", "–", "–", row["note"]])
        else:
            prec.append([row["name"], "0 (reference)" if row["name"] == "float32" else _kl(row["kl"]),
                         _n(row["agreement"], 2, pct=True), _n(row["chars_per_s"], 0), row["what"]])
    prec_how = (f"KL divergence of each model's next-character distribution from the float32 model's, and the share "
                f"of positions where both rank the same character first, on {p['rows'][0]['positions']:,} positions of "
                f"validation windows; decode speed: {p['decode_chars']} characters written at batch 1 on this machine.")
    return [("The run", [facts]),
            ("Compression", [lead, comp]),
            ("Samples across temperatures", [how, table, *notes, suggestion]),
            ("What precision and exports cost", [prec_how, prec])]


def _md_table(rows):
    out = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    return "\n".join(out + ["| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in row) + " |"
                            for row in rows[1:]])


def markdown(r):
    out = [f"# Report: {r['run']['path']}", ""]
    for head, parts in sections(r):
        out += [f"## {head}", ""]
        for part in parts:
            out += [_md_table(part) if isinstance(part, list) else part, ""]
        if head == "Compression":
            out += [f"![loss curve]({r['curve']['file']})" if r["curve"].get("file") else
                    r["curve"].get("note", "The loss curve is in report.html."), ""]
    out += ["## Samples", ""]
    for row in r["samples"]["rows"]:
        text = row["text"][:MD_SAMPLE_CHARS]
        out += [f"Temperature {row['temperature']:g}:", "", "```text", text.replace("```", "'''"), "```", ""]
    return "\n".join(out)


STYLE = ("body{font:15px/1.45 system-ui,sans-serif;max-width:70em;margin:2em auto;padding:0 1em;color:#222}"
         "table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:.25em .5em;"
         "text-align:left;vertical-align:top}th{background:#f3f3f3}pre{white-space:pre-wrap;background:#f7f7f7;"
         "padding:.6em;border:1px solid #e3e3e3}img{max-width:100%}.note{color:#555}")


def _html_table(rows):
    e = html.escape
    head = "".join(f"<th>{e(str(c))}</th>" for c in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in row) + "</tr>" for row in rows[1:])
    return f"<table><tr>{head}</tr>{body}</table>" if any(rows[0]) else f"<table>{body}</table>"


def html_page(r):
    e = html.escape
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f"<title>Report: {e(r['run']['path'])}</title><style>{STYLE}</style></head><body>",
           f"<h1>Report: {e(r['run']['path'])}</h1>"]
    for head, parts in sections(r):
        out.append(f"<h2>{e(head)}</h2>")
        out += [_html_table(part) if isinstance(part, list) else f"<p>{e(part)}</p>" for part in parts]
        if head == "Compression":
            out.append(f'<img alt="loss curve" src="data:image/png;base64,{r["curve"]["png"]}">' if "png" in r["curve"]
                       else f'<p class="note">{e(r["curve"]["note"])}</p>')
    out.append("<h2>Samples</h2>")
    for row in r["samples"]["rows"]:
        out.append(f"<h3>Temperature {row['temperature']:g}</h3><pre>{e(row['text'])}</pre>")
    out.append("</body></html>")
    return "\n".join(out)

