"""The page itself: page.html with its style, its scripts, the model's description and its weights filled in.

    html = render(description, blob)     # one self-contained HTML document (str)
    description, blob = read_page(text)  # what a written page holds (the export's checks read it back)

The template's slots are HTML comments (<!--STYLE-->, <!--DECODER-->, ...) filled in one pass, so nothing inside the
inserted text is ever taken for a slot. Inside a <script> element only "</" could end it early: JSON escapes it as
"<\\/" and base64 has no "<"; the scripts are checked not to hold it. The page's Content-Security-Policy allows
inline scripts and styles and data: images, nothing else: it cannot fetch or load anything.
"""

import base64
import json
import re
from importlib import resources

from chargpt.errors import ChargptError

GENERATOR = "chargpt export --format web"  # the page's <meta name="generator">: how --force knows an earlier export
SLOTS = ("TITLE", "STYLE", "DESCRIPTION", "WEIGHTS", "DECODER", "PAGE")
MARK = {"description": 'id="chargpt-model"', "weights": 'id="chargpt-weights"'}


def asset(name):
    """A file of the package (decoder.js, page.js, page.html, page.css, check.js) as text."""
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def script_safe(text, what):
    if "</" in text:
        raise ChargptError(f"{what} holds '</', which would end its <script> early; report it")
    return text


def html_escape(text):
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def render(description, blob):
    """-> the page (str): the model's description (a JSON-able dict) and weights (bytes) embedded."""
    fill = {
        "TITLE": html_escape(description["info"]["name"]),
        "STYLE": asset("page.css"),
        "DESCRIPTION": json.dumps(description, ensure_ascii=False).replace("</", "<\\/"),
        "WEIGHTS": base64.b64encode(blob).decode("ascii"),
        "DECODER": script_safe(asset("decoder.js"), "decoder.js"),
        "PAGE": script_safe(asset("page.js"), "page.js"),
    }
    return re.sub(r"<!--(" + "|".join(SLOTS) + r")-->", lambda m: fill[m[1]], asset("page.html"))


def script_text(text, mark):
    """The text of the <script> whose opening tag holds `mark`, or None."""
    at = text.find(mark)
    start = text.find(">", at) + 1 if at >= 0 else -1
    end = text.find("</script>", start) if start > 0 else -1
    return text[start:end] if end >= 0 else None


def read_page(text):
    """A page's text -> (description dict, weights bytes); ValueError if it is not a whole page."""
    description, weights = script_text(text, MARK["description"]), script_text(text, MARK["weights"])
    if description is None or weights is None:
        raise ValueError("not a chargpt page: its model or its weights are missing")
    return json.loads(description), base64.b64decode(weights.strip(), validate=True)


def is_export(path, head=4096):
    """Whether the file at `path` is a page an earlier web export wrote (its generator mark, near the top)."""
    try:
        with open(path, "rb") as f:
            return f'<meta name="generator" content="{GENERATOR}">'.encode() in f.read(head)
    except OSError:
        return False
