"""`sample.py --interactive`: load the model once, then answer prompt after prompt.

Commands between prompts change the settings: /temp 0.5, /topk 40, /topp 0.9, /len 300, /seed 7, /show,
/help, /quit. An empty line samples from the default start. Ctrl-C stops the current sample only; Ctrl-D
(end of input) exits.
"""

import random
import sys

from .errors import ChargptError
from .sampling import SampleSettings

HELP = ("commands: /temp T  /topk K (0: off)  /topp P (1: off)  /len N  /seed S  /show  /help  /quit; "
        "anything else is a prompt")
SETTERS = {"/temp": ("temperature", float), "/topk": ("top_k", int), "/topp": ("top_p", float),
           "/len": ("max_new_tokens", int)}


def repl(gen, settings, seed, unknown, inp=None, out=None, err=None):
    inp, out, err = inp or sys.stdin, out or sys.stdout, err or sys.stderr
    settings = dict(settings)
    rng = random.Random(seed)
    err.write(HELP + "\n")
    while True:
        err.write("> ")
        err.flush()
        line = inp.readline()
        if not line:  # Ctrl-D
            err.write("\n")
            return
        line = line.rstrip("\n")
        word, _, arg = line.strip().partition(" ")
        if word in ("/quit", "/exit"):
            return
        if word == "/help":
            err.write(HELP + "\n")
            continue
        if word == "/show":
            err.write(f"{settings} seed={seed}\n")
            continue
        if word == "/seed":
            try:
                seed = int(arg)
                rng = random.Random(seed)
            except ValueError:
                err.write("usage: /seed INTEGER\n")
            continue
        if word in SETTERS:
            key, cast = SETTERS[word]
            try:
                value = cast(arg)
                if key == "top_k" and value == 0:
                    value = None
                if key == "top_p" and value == 1:
                    value = None
                SampleSettings(**{**settings, key: value}).validate()
                settings[key] = value
                err.write(f"{key} = {value}\n")
            except (ValueError, ChargptError) as e:
                err.write(f"invalid value for {word}: {e}\n")
            continue
        if word.startswith("/"):
            err.write(f"unknown command {word}; {HELP}\n")
            continue
        sample_seed = rng.randrange(2**31)
        out.write(line)
        try:
            for _, piece in gen.stream(line, seed=sample_seed, unknown=unknown, **settings):
                out.write(piece)
                out.flush()
        except ChargptError as e:
            err.write(f"error: {e}\n")
        except KeyboardInterrupt:
            err.write("\n[stopped]")
        out.write("\n")
        out.flush()
