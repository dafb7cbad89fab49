"""The code's shape stays readable: no module past the size where it stops being read whole, no import circles,
nothing importing a layer above its own, no test file importing another, and comments about behaviour, not
history. The layers, lowest first, are the map docs/contributing.md describes."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "chargpt"
MAX_LINES = 600  # a module past this is two concerns
MAX_TRAINER_LINES = 300  # the Trainer is the loop; what it calls lives in chargpt/training/
MAX_TRAINING_LINES = 400

# Each module (or package, with .*) and the layer it belongs to. A module imports only from its own layer or
# below; within a layer, without circles. A new module is added here, at the lowest layer its imports allow.
LAYERS = [
    # 0: nothing of chargpt's
    ["errors", "platforms", "config.presets", "model.loss", "data.tang", "config.flags", "training.interrupt",
     "tools.novelty.report",
     "tools.report.measures", "tools.report.render",
     "web.limits", "web.middleware", "data", "model", "runs", "sampling", "tools"],
    # 1: settings' vocabulary, files and devices
    ["config.architecture", "config", "runs.rundir", "runtime", "textio", "training.schedules", "data.tokenizer",
     "training.flat", "data.corpora", "sampling.forms", "sampling.grammar", "tools.novelty.score",
     "tools.novelty.suffixarray",
     "tools.novelty.cache", "sampling.options", "config.decoding"],
    # 2: models, data and checkpoints
    ["model.dropout", "model.adaptive", "model.transformer", "training.optim", "model.quantize", "sampling.decode",
     "data.corpus", "data.pairs", "runs.checkpoint", "training.sizing", "model.inside", "config.settings",
     "config.helptext", "training.init_from", "sampling.translate", "sampling.constraints", "data.items",
     "data.labels", "threads", "sampling.speculate", "sampling.beam", "data.fim", "sampling.infill",
     "sampling.suggest"],
    # 3: what uses a model: sampling engine, evaluation, novelty, run information, and training's parts
    ["sampling.engine", "tools.evaluate", "runs.info", "runs.plot", "tools.export", "tools.webpage",
     "tools.ggufread", "tools.gguf", "tools.onnx",
     "tools.webpage.*", "tools.novelty", "tools.novelty.*", "training", "training.*", "training.tasks", "tools.report",
     "tools.report.*"],
    # 4: the loop
    ["training.trainer"],
    # 5: the surfaces people use
    ["chargpt", "cli", "cli.*", "cli.repl", "serve", "__main__", "web", "web.*", "bench", "bench.*"],
]


def module_name(path):
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    package = parts[-1] == "__init__"
    if package:
        parts.pop()
    return ".".join(parts), parts if package else parts[:-1]


def imports_of(path):
    """The chargpt modules a file imports, at its top or inside functions."""
    name, package = module_name(path)
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = ".".join(package[:len(package) - node.level + 1] + [node.module or ""]) if node.level \
                else node.module or ""
            base = base.rstrip(".")
            if base.startswith("chargpt"):
                found.update({base, *(f"{base}.{alias.name}" for alias in node.names)})
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("chargpt"))
    return found


def import_graph():
    files = {module_name(p)[0]: p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in files.items():
        # `from . import x` names both the package and x: the package counts only if nothing more was named
        deps = {d for d in imports_of(path) if d in files and d != name}
        graph[name] = {d for d in deps if not any(o.startswith(d + ".") for o in deps)}
    return graph


def layer_of(module):
    short = module.removeprefix("chargpt.") if module != "chargpt" else "chargpt"
    exact = [i for i, names in enumerate(LAYERS) if short in names]  # a module named in LAYERS: its own
    if exact:  # layer, before any package's .* (training.trainer is the loop, above training.*)
        return exact[0]
    for i, names in enumerate(LAYERS):
        for entry in names:
            if entry.endswith(".*") and short.startswith(entry[:-1]):
                return i
    return None


def test_no_module_is_too_long_to_read_whole():
    files = [*PACKAGE.rglob("*.py"), *PACKAGE.rglob("*.js")]
    long = {str(p.relative_to(ROOT)): n for p in files if (n := len(p.read_text(encoding="utf-8").splitlines()))
            > MAX_LINES}
    assert not long, f"over {MAX_LINES} lines: {long}"


def test_the_trainer_is_only_its_loop():
    source = (PACKAGE / "training" / "trainer.py").read_text(encoding="utf-8")
    assert len(source.splitlines()) <= MAX_TRAINING_LINES
    trainer = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "Trainer")
    assert trainer.end_lineno - trainer.lineno + 1 <= MAX_TRAINER_LINES


def test_every_module_has_a_layer_and_imports_nothing_above_it():
    graph = import_graph()
    unplaced = sorted(m for m in graph if layer_of(m) is None)
    assert not unplaced, f"add these modules to a layer in LAYERS: {unplaced}"
    upward = sorted(f"{m} (layer {layer_of(m)}) imports {d} (layer {layer_of(d)})"
                    for m, deps in graph.items() for d in deps if layer_of(d) > layer_of(m))
    assert not upward, "\n".join(upward)


def test_no_import_circles():
    graph, done, circles = import_graph(), set(), []

    def visit(node, path):
        if node in path:
            circles.append(" -> ".join(path[path.index(node):] + [node]))
            return
        if node in done:
            return
        for dep in sorted(graph[node]):
            visit(dep, path + [node])
        done.add(node)

    for module in sorted(graph):
        visit(module, [])
    assert not circles, "\n".join(circles)


def test_no_test_file_imports_another():
    tests = {p.stem for p in (ROOT / "tests").glob("test_*.py")} | {"conftest"}  # shared helpers: tests/helpers.py
    found = sorted(f"{p.name} imports {d}" for p in (ROOT / "tests").glob("*.py")
                   for node in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
                   for d in ([node.module] if isinstance(node, ast.ImportFrom) else
                             [a.name for a in node.names] if isinstance(node, ast.Import) else [])
                   if d in tests)
    assert not found, found


def test_comments_and_test_names_speak_of_behaviour_not_history():
    history = re.compile(r"issue\s#|round\s[0-9]")
    found = [f"{p.relative_to(ROOT)}:{i}" for folder in (PACKAGE, ROOT / "tests") for p in folder.rglob("*")
             if p.suffix in (".py", ".js", ".html", ".css")
             for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if history.search(line)]
    assert not found, found
