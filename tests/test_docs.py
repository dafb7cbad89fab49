"""The commands in README.md and docs/*.md work as written, after the steps before them.

Every shell command in a code block (indented, or fenced as bash or without a language) is read in document
order, the README first and then each guide after it. Each must name a real command, subcommand and flags (parsed
by chargpt's own click commands and argparse parsers), and every file it reads must be one an earlier step made
(a download, a training run, a redirect, a config file shown in the docs), one in this repository, or one the
text introduces as the reader's own (YOURS). Then the README and the user guides run end to end, in-process,
with tiny model sizes substituted and the corpus download replaced by a small local text (no network). Links
between the docs, and the repository files they name, must exist.
"""

import argparse
import importlib.util
import json
import os
import re
import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from helpers import ROOT, TINY_FLAGS

import chargpt
import chargpt.data.corpora as corpora
from chargpt.cli import main as chargpt_main
from chargpt.cli import sample_cli, train_cli

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

README = ROOT / "README.md"
GUIDES = sorted((ROOT / "docs").glob("*.md"))
# files the docs introduce as the reader's own ("notes.txt stands for a text file of yours"): what they must bring
YOURS = {"notes.txt", "data/my_poems/", "other_play.txt", "ita.tsv", "en.txt", "test.tsv", "names.txt",
         "data/authors/", "defs.jsonl", "def.json"}
INPUT_FLAGS = ("--data", "--target-data", "--config", "--checkpoint", "--prompt-file", "--input", "--candidates",
               "--nanogpt", "--grammar", "--json-schema")
OUTPUT_FLAGS = ("--out-dir", "--output", "-o")
STARTERS = ("python", "python3", "chargpt", "torchrun", "pip", "bash", "echo", "printf", "git")
BUILTIN_CORPUS = "pydoc-topics"  # data.DEFAULT_CORPUS_NAME: the run dir of a train without --data
# the JSON schema docs/sampling.md holds the reader's JSON lines to (def.json)
DEF = {"type": "object", "properties": {"name": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"},
                                       "kind": {"enum": ["def", "class"]}, "module": {"type": "string"}},
       "required": ["name", "kind", "module"], "additionalProperties": False}


# --- reading the docs -------------------------------------------------------------------------------------------
@dataclass
class Block:
    doc: str
    line: int
    kind: str  # "shell", "python", "toml" or "other"
    text: str


def code_blocks(path):
    """The code blocks of a Markdown file, in order: fenced ones (their language decides the kind) and indented
    ones (4 spaces after a blank line, outside a list item's text: shell)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        fence = re.match(r"^```(\w*)\s*$", lines[i])
        if fence:
            lang, start = fence[1], i
            i += 1
            body = []
            while not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            kind = "shell" if lang in ("", "bash", "sh", "shell", "console") else \
                lang if lang in ("python", "toml") else "other"
            blocks.append(Block(path.name, start + 1, kind, "\n".join(body)))
        elif lines[i].startswith("    ") and (i == 0 or not lines[i - 1].strip()):
            start, body = i, []
            while i < len(lines) and (lines[i].startswith("    ") or not lines[i].strip()):
                body.append(lines[i][4:])
                i += 1
            blocks.append(Block(path.name, start + 1, "shell", "\n".join(body).rstrip()))
            continue
        i += 1
    return blocks


def command_lines(block):
    """A shell block -> its command lines (continuations joined), leaving out output shown in the block."""
    text = re.sub(r"\\\n\s*", " ", block.text)
    out = []
    for line in text.splitlines():
        words = line.split()
        first = next((w for w in words if not re.match(r"^[A-Z_]+=", w)), "")
        if first.split("=$(")[-1] in STARTERS:
            out.append(line)
    return out


def simple_commands(line):
    """One shell line -> [(argv, input_from_pipe, redirected_to)]: split at && | ; and $( ), comments dropped."""
    lex = shlex.shlex(line, posix=True, punctuation_chars="|&;()<>")
    lex.whitespace_split = True
    tokens = list(lex)
    commands, current = [], []
    for tok in tokens + [";"]:
        if tok in ("&&", "||", ";", "|", "(", ")", "$("):
            if current:
                commands.append((current, tok))
            current = []
        else:
            current.append(tok)
    out, piped = [], None
    for argv, sep in commands:
        redirect = None
        if ">" in argv:
            k = argv.index(">")
            argv, redirect = argv[:k], argv[k + 1]
        argv = [a for a in argv if not re.match(r"^[A-Za-z_]+=\$?$|^[A-Z_]+=\S+$", a)]  # VAR=, run=$
        if argv:
            out.append((argv, piped, redirect))
        piped = argv if sep == "|" else None
    return out


# --- what a command names must exist ----------------------------------------------------------------------------
class Parsed(Exception):
    """Raised in place of running a command whose flags parsed."""


def check_argparse(main, args, monkeypatch):
    """Parse args with the argparse parser that `main` builds, and stop there."""
    parse = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, argv=None, namespace=None):
        raise Parsed(parse(self, argv, namespace))
    with monkeypatch.context() as m:
        m.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
        try:
            main(list(args))
        except Parsed as p:
            return p.args[0]
        except SystemExit as e:
            raise AssertionError(f"{args}: argparse refused it (exit {e.code})") from None
    raise AssertionError(f"{args}: parsed nothing")


def click_leaf(command, args):
    """Walk a click group down its subcommands -> (leaf command, its name path, the leaf's arguments)."""
    names = []
    while isinstance(command, click.Group):
        assert args, f"{' '.join(names)}: a subcommand is missing"
        sub = command.get_command(click.Context(command), args[0])
        assert sub is not None, f"chargpt {' '.join(names)}: no subcommand {args[0]!r}"
        names.append(args[0])
        command, args = sub, args[1:]
    return command, names, list(args)


def check_click(command, args, prog):
    """Parse args with a click command (unknown flags, bad choices and types fail), without running it."""
    try:
        with command.make_context(prog, list(args)) as ctx:
            return ctx.params
    except click.exceptions.Exit:  # --help, --version
        return {}
    except click.ClickException as e:
        raise AssertionError(f"{prog} {shlex.join(args)}: {e.format_message()}") from None


def pyproject_extras():
    return set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])


@dataclass
class World:
    """What exists after the steps so far: files and runs made, plus the repository and the reader's own files."""

    made: set = field(default_factory=set)
    runs: list = field(default_factory=list)  # run directories, oldest first
    config_data: dict = field(default_factory=dict)  # config files shown in the docs -> their `data`
    where: str = ""

    def has(self, path):
        path = path.rstrip("/")
        if path.startswith("$"):  # a shell variable set by an earlier step (run=$(python train.py ...))
            return True
        in_repo = (ROOT / path).resolve().is_relative_to(ROOT.resolve()) and (ROOT / path).exists()  # not ../shared
        return path in self.made or in_repo or path + "/" in YOURS or path in YOURS or \
            any(path.startswith(m + "/") for m in self.made)

    def need(self, path, what):
        assert self.has(path), f"{self.where}: {what} {path} does not exist at this step (no earlier step makes it)"

    def new_run(self, name):
        root = f"checkpoints/{name}"
        run = next(d for d in [root] + [f"{root}-{i}" for i in range(2, 100)] if d not in self.runs)
        self.runs.append(run)
        self.made |= {run, f"{run}/config.toml", f"{run}/best.safetensors"}
        return run


def flag_values(args, flags):
    """[(flag, value)] for every `--flag value` or `--flag=value` in args with flag in flags."""
    out = []
    for i, a in enumerate(args):
        name, eq, value = a.partition("=")
        if name in flags:
            out.append((name, value if eq else (args[i + 1] if i + 1 < len(args) else "")))
    return out


def corpus_data(args, world):
    """The --data a training reads: its flag, else its config file's (one the docs show, or a run's config.toml)."""
    data = dict(flag_values(args, ("--data",))).get("--data")
    config = dict(flag_values(args, ("--config",))).get("--config")
    return world.config_data.get(config) if data is None and config else data


def corpus_name(args, world):
    data = corpus_data(args, world)
    return BUILTIN_CORPUS if data is None else Path(data.rstrip("/")).stem or Path(data).name


def check_train(args, world, prog):
    check_click(train_cli, args, prog)
    for flag, value in flag_values(args, INPUT_FLAGS):
        world.need(value, flag)
    out = dict(flag_values(args, ("--out-dir",))).get("--out-dir")
    if "--resume" in args:
        assert out or any(r.split("/")[-1].rsplit("-", 1)[0] == corpus_name(args, world) for r in world.runs), \
            f"{world.where}: --resume, but no earlier step trained on this corpus"
        return
    if out:
        world.runs.append(out)
        world.made |= {out, f"{out}/config.toml"}
    else:
        run = world.new_run(corpus_name(args, world))
        world.config_data[f"{run}/config.toml"] = corpus_data(args, world)


def check_command(argv, world, monkeypatch):
    """One simple command: its names parse, its inputs exist; -> records what it makes in `world`."""
    prog, args = argv[0], argv[1:]
    if prog in ("python", "python3"):
        if args[0] == "-m":
            module, rest = args[1], args[2:]
            if module == "chargpt":
                return check_command(["chargpt", *rest], world, monkeypatch)
            if module == "chargpt.bench":
                return check_bench(rest, world, monkeypatch)
            if module == "chargpt.bench.serve":
                from chargpt.bench.serve import main
                return check_argparse(main, rest, monkeypatch)
            if module == "pytest":
                for path in (a for a in rest if not a.startswith("-")):
                    world.need(path, "pytest's")
                return
            assert importlib.util.find_spec(module) is not None, f"{world.where}: no module {module}"
            if module == "chargpt.serve":
                from chargpt.serve import main
                return check_click(main, rest, "python -m chargpt.serve")
            return
        script, rest = args[0], args[1:]
        world.need(script, "script")
        if script == "train.py":
            return check_train(rest, world, "train.py")
        if script == "sample.py":
            return check_sample(rest, world, "sample.py")
        return
    if prog == "chargpt":
        command, names, rest = click_leaf(chargpt_main, args)
        where = "chargpt " + " ".join(names)
        if names == ["train"]:
            return check_train(rest, world, where)
        if names == ["sample"]:
            return check_sample(rest, world, where)
        if names == ["bench"]:
            return check_bench(rest, world, monkeypatch)
        params = check_click(command, rest, where)
        if names == ["data", "get"]:
            name = params["name"]
            assert name in corpora.CORPORA, f"{world.where}: chargpt data get {name}: no such corpus"
            world.made.add(f"{params['data_dir']}/{corpora.CORPORA[name].filename}")
        for flag, value in flag_values(rest, INPUT_FLAGS):
            world.need(value, flag)
        if names in (["info"], ["plot"], ["report"]):
            for run in (a for a in rest if "/" in a and not a.startswith("-")):
                world.need(run, "run")
        if names in (["sample"], ["translate"], ["eval"], ["info"], ["report"]) and "--checkpoint" not in rest:
            assert world.runs, f"{world.where}: {where} uses the newest run, but no earlier step trained one"
        for _, value in flag_values(rest, OUTPUT_FLAGS):
            world.made.add(value)
        return
    if prog == "torchrun":
        script = next(i for i, a in enumerate(args) if a.endswith(".py"))
        return check_command(["python", *args[script:]], world, monkeypatch)
    if prog == "pip":
        for extra in re.findall(r"\.\[([\w,]+)\]", " ".join(args)):
            assert set(extra.split(",")) <= pyproject_extras(), f"{world.where}: pip extra [{extra}] is unknown"
        return
    if prog == "bash":
        return world.need(args[0], "script")
    if prog == "git" and args[0] == "clone":
        world.made.add(args[2] if len(args) > 2 else Path(args[1]).stem)
        return
    assert prog in ("echo", "printf"), f"{world.where}: {prog} is not a command these docs should use"


def check_sample(args, world, prog):
    check_click(sample_cli, args, prog)
    for flag, value in flag_values(args, INPUT_FLAGS):
        world.need(value, flag)
    if "--checkpoint" not in args:
        assert world.runs, f"{world.where}: {prog} uses the newest run, but no earlier step trained one"


def check_bench(args, world, monkeypatch):
    from chargpt.bench import main
    check_argparse(main, args, monkeypatch)
    for flag, value in flag_values(args, INPUT_FLAGS):
        world.need(value, flag)


def walk(path, world, monkeypatch):
    """Check every command of one document in order, updating the world."""
    for block in code_blocks(path):
        world.where = f"{path.relative_to(ROOT)}:{block.line}"
        if block.kind == "toml":  # a config file the reader writes: its first line names it
            name = re.match(r"#\s*(\S+)", block.text)
            assert name, f"{world.where}: a TOML block should start with '# FILE.toml'"
            world.made.add(name[1])
            world.config_data[name[1]] = tomllib.loads(block.text).get("data")
            continue
        if block.kind == "python":
            for literal in re.findall(r"""(?:data=|load\()["']([^"']+)["']""", block.text):
                world.need(literal, "Python's")
            continue
        if block.kind != "shell":
            continue
        for line in command_lines(block):
            world.where = f"{path.relative_to(ROOT)}:{block.line}: {line.strip()[:80]}"
            for argv, _piped, redirect in simple_commands(line):
                check_command(argv, world, monkeypatch)
                if redirect:
                    world.made.add(redirect)


def readme_world(monkeypatch):
    world = World()
    walk(README, world, monkeypatch)
    return world


def test_readme_commands_name_real_commands_flags_and_files(monkeypatch):
    world = readme_world(monkeypatch)
    assert "checkpoints/pydoc-topics" in world.runs and "data/tinyshakespeare.txt" in world.made


@pytest.mark.parametrize("guide", GUIDES, ids=lambda p: p.name)
def test_guide_commands_name_real_commands_flags_and_files(guide, monkeypatch):
    """Each guide is read after the README: its steps may use what the README's made."""
    world = readme_world(monkeypatch)
    walk(guide, world, monkeypatch)


def test_the_checks_catch_what_fails():
    """The checker itself: an unknown flag, subcommand, corpus or file is an error, not a pass."""
    world = World(runs=["checkpoints/notes"], made={"checkpoints/notes"})
    for bad in (["python", "train.py", "--data", "data/shakespeare.txt"],  # the README's old mistake
                ["python", "train.py", "--no-such-flag"],
                ["chargpt", "data", "get", "shakespeare"],
                ["chargpt", "frobnicate"],
                ["python", "sample.py", "--prompt-file", "start.txt"],
                ["python", "-m", "chargpt.bench", "pairs", "--data", "../shared/data/tang_poems.txt"],
                ["pip", "install", "-e", ".[nosuchextra]"],
                ["python", "-m", "chargpt.nosuchmodule"],
                ["python", "-m", "chargpt.bench", "--only", "nosuchpart"],
                ["chargpt", "info", "checkpoints/shakespeare"]):
        with pytest.raises(AssertionError):
            check_command(bad, world, pytest.MonkeyPatch())
    assert simple_commands('run=$(python train.py --data notes.txt) && python sample.py --checkpoint "$run"') == \
        [(["python", "train.py", "--data", "notes.txt"], None, None),
         (["python", "sample.py", "--checkpoint", "$run"], None, None)]
    assert simple_commands("printf 'The ' > start.txt  # a comment") == [(["printf", "The "], None, "start.txt")]


# --- links and file names -----------------------------------------------------------------------------------
def anchors(path):
    """GitHub's anchors for a file's headings."""
    heads = re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def test_every_guide_is_one_click_from_the_readme_and_every_link_resolves():
    readme = README.read_text(encoding="utf-8")
    for guide in GUIDES:
        assert f"](docs/{guide.name})" in readme, f"README.md does not link docs/{guide.name}"
    for doc in [README, *GUIDES]:
        for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text(encoding="utf-8")):
            if re.match(r"https?://", target):
                continue
            file, _, anchor = target.partition("#")
            dest = (doc.parent / file).resolve() if file else doc
            assert dest.exists(), f"{doc.name}: link to {target}: no such file"
            if anchor:
                assert anchor in anchors(dest), f"{doc.name}: link to {target}: no such heading"


def test_repository_files_the_docs_name_exist():
    pattern = r"`((?:chargpt|scripts|tests|benchmarks)/[\w/.\-]*\w)`"
    for doc in [README, *GUIDES]:
        for name in re.findall(pattern, doc.read_text(encoding="utf-8")):
            assert (ROOT / name).exists(), f"{doc.name} names {name}, which is not in the repository"


# --- running them ---------------------------------------------------------------------------------------------
SKIPPED = ("pip", "bash", "git", "torchrun")  # installs, the GPU check, clones, several processes: checked above
SKIPPED_MODULES = ("pytest", "chargpt.bench", "chargpt.bench.serve", "chargpt.serve")  # long or a server
SKIPPED_SUBCOMMANDS = ("bench", "serve")
TIME_FLAGS = ("--max-time", "--max-iters", "--eval-interval")


def english():
    """A small English text holding every character the docs' prompts use."""
    from chargpt.data.corpus import default_corpus_text
    return default_corpus_text()[:20_000] + "".join(f"ROMEO: JULIET: line {i}.\n" for i in range(50))


def your_files():
    """The reader's own files (YOURS), small."""
    Path("notes.txt").write_text(english(), encoding="utf-8")
    Path("other_play.txt").write_text(english()[::-1], encoding="utf-8")
    Path("data/my_poems").mkdir(parents=True)
    for i in range(2):
        Path(f"data/my_poems/{i}.txt").write_text(english()[i * 5000:(i + 1) * 5000], encoding="utf-8")
    pairs = [("Good morning.", "Buongiorno."), ("Hi.", "Ciao."), ("Thanks.", "Grazie."), ("Yes.", "Sì.")] * 20
    Path("ita.tsv").write_text("".join(f"{s}\t{t}\tCC-BY\n" for s, t in pairs), encoding="utf-8")
    Path("test.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in pairs[:8]), encoding="utf-8")
    Path("en.txt").write_text("Good morning.\n\nThanks.\n", encoding="utf-8")
    names = sorted(set(english().split()))[:400] + ["get_item", "get_name", "set_name"]  # --regex "get_[a-z]{3,8}"
    Path("names.txt").write_text("".join(f"{w}\n" for w in names), encoding="utf-8")
    defs = [{"name": n, "kind": "def", "module": "json"} for n in ["dumps", "loads", "get_item", "JSONDecoder"] * 50]
    Path("defs.jsonl").write_text("".join(json.dumps(d) + "\n" for d in defs), encoding="utf-8")
    Path("def.json").write_text(json.dumps(DEF), encoding="utf-8")
    for i, label in enumerate(("code", "help")):  # several texts, one a label (--labels folders)
        Path(f"data/authors/{label}").mkdir(parents=True)
        Path(f"data/authors/{label}/{label}.txt").write_text(english()[i * 6000:(i + 1) * 6000], encoding="utf-8")


def fake_get(name, data_dir="data", log=print, **kw):
    """chargpt data get without the network: a small stand-in with the published file's name."""
    poem = "春眠不覺曉，處處聞啼鳥。\n床前明月光，疑是地上霜。舉頭望明月，低頭思故鄉。"  # what the docs' prompts use
    text = "".join(f"{poem}{i}\n\n" for i in range(200)) if name == "tang" else english()
    path = Path(data_dir) / corpora.lookup(name).filename
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    log(f"(test) wrote a stand-in for {name} to {path}")
    return path


class Runner:
    """Runs the docs' commands in-process in the current folder, tiny sizes substituted."""

    def __init__(self):
        self.steps = 0  # each training gets a larger step budget, so that --resume always has more to do
        self.vars = {}
        self.ran = []

    def invoke(self, command, args, where, stdin=None):
        r = CliRunner().invoke(command, args, input=stdin, catch_exceptions=False)
        assert r.exit_code == 0, f"{where}: exit {r.exit_code}\n{r.stderr[-2000:]}"
        self.ran.append(where)
        return r.stdout

    def train(self, args, where):
        kept, skip = [], False
        for a in args:
            if skip:
                skip = False
            elif a in TIME_FLAGS:
                skip = True
            elif a.split("=")[0] not in TIME_FLAGS:
                kept.append(a)
        self.steps += 4
        tiny = [*TINY_FLAGS, "--sample-chars", "10"]  # short samples: a config file may ask for --sample-every
        return self.invoke(train_cli, [*kept, *tiny, "--max-iters", str(8 + self.steps), "--eval-interval", "4"],
                           where)

    def sample(self, args, where, stdin):
        if "--interactive" in args:
            stdin = "/quit\n"  # the newest run may be any of the reader's: a prompt could hold unseen characters
        return self.invoke(sample_cli, [*args, "--max-new-tokens", "12"], where, stdin)

    def run(self, argv, where, stdin=None):
        argv = [self.vars.get(a, a) for a in argv]
        prog, args = argv[0], argv[1:]
        if prog in ("python", "python3") and args[0] == "-m":
            if args[1] in SKIPPED_MODULES:
                return ""
            return self.run(["chargpt", *args[2:]], where, stdin)
        if prog in ("python", "python3"):
            if args[0] == "train.py":
                return self.train(args[1:], where)
            if args[0] == "sample.py":
                return self.sample(args[1:], where, stdin)
            return ""  # scripts/: checked above, not run
        if prog == "chargpt":
            if args[0] in SKIPPED_SUBCOMMANDS or (args[0] == "plot" and importlib.util.find_spec("matplotlib") is
                                                  None):
                return ""
            if args[0] == "train":
                return self.train(args[1:], where)
            if args[0] == "sample":
                return self.sample(args[1:], where, stdin)
            return self.invoke(chargpt_main, args, where, stdin)
        if prog == "echo":
            return " ".join(args) + "\n"
        if prog == "printf":
            return args[0]
        assert prog in SKIPPED, where
        return ""

    def shell_line(self, line, where):
        assign = re.match(r"^\s*(\w+)=\$\(", line)
        piped = None
        for argv, from_pipe, redirect in simple_commands(line):
            out = self.run(argv, where, piped if from_pipe else None)
            if redirect:
                Path(redirect).write_text(out, encoding="utf-8")
            if assign and f"${assign[1]}" not in self.vars:
                self.vars[f"${assign[1]}"] = out.strip().splitlines()[-1]
            piped = out

    def python_block(self, block, where, monkeypatch):
        real_train = chargpt.train

        def tiny_train(**kw):
            tiny = dict(device="cpu", n_layer=1, n_head=2, n_embd=16, block_size=16, batch_size=4, eval_iters=2,
                        dropout=0.0, threads=1, sample_chars=0, dtype="float32", curves=False)
            return real_train(**{**kw, **tiny, "max_iters": 8, "eval_interval": 4, "log": lambda m: None})
        monkeypatch.setattr(chargpt, "train", tiny_train)
        exec(compile(block.text, where, "exec"), {"__name__": "__doc_example__"})
        self.ran.append(where)

    def doc(self, path, monkeypatch):
        for block in code_blocks(path):
            where = f"{path.relative_to(ROOT)}:{block.line}"
            if block.kind == "toml":
                Path(re.match(r"#\s*(\S+)", block.text)[1]).write_text(block.text, encoding="utf-8")
            elif block.kind == "python":
                self.python_block(block, where, monkeypatch)
            elif block.kind == "shell":
                for line in command_lines(block):
                    self.shell_line(line, f"{where}: {line.strip()[:80]}")


@pytest.fixture(scope="module")
def after_readme(tmp_path_factory):
    """A folder where the README's commands have all run, as a reader would have it: -> its path."""
    root = tmp_path_factory.mktemp("readme")
    here = os.getcwd()
    with pytest.MonkeyPatch.context() as m:
        m.setenv("CHARGPT_CACHE_DIR", str(root / ".cache"))
        m.setenv("CUDA_VISIBLE_DEVICES", "")
        m.setattr(corpora, "get", fake_get)
        os.chdir(root)
        try:
            your_files()
            runner = Runner()
            runner.doc(README, m)
        finally:
            os.chdir(here)
    assert any("sample.py" in w for w in runner.ran) and any(".md:" in w for w in runner.ran)
    return root


def test_readme_runs_as_written(after_readme):
    runs = {p.name for p in (after_readme / "checkpoints").iterdir()}
    assert {"pydoc-topics", "tinyshakespeare", "my_poems", "notes"} <= runs  # the first command, then your text


RUN_GUIDES = [g for g in GUIDES if g.name in ("training.md", "sampling.md", "runs.md", "translation.md", "novelty.md")]


@pytest.mark.parametrize("guide", RUN_GUIDES, ids=lambda p: p.name)
def test_guide_runs_as_written_after_the_readme(guide, after_readme, tmp_path, monkeypatch):
    work = tmp_path / "reader"
    shutil.copytree(after_readme, work)
    monkeypatch.chdir(work)
    monkeypatch.setenv("CHARGPT_CACHE_DIR", str(work / ".cache"))
    monkeypatch.setattr(corpora, "get", fake_get)
    runner = Runner()
    runner.doc(guide, monkeypatch)
    assert len(runner.ran) >= 3, runner.ran  # its commands ran, not only skipped
