"""The page itself: page.html with its style, its scripts, the model's description and its weights filled in.

    html = render(description, blob)     # one self-contained HTML document (str)
    description, blob = read_page(text)  # what a written page holds (the export's checks read it back)

The template's slots are HTML comments (<!--STYLE-->, <!--DECODER-->, ...) filled in one pass, so nothing inside the
inserted text is ever taken for a slot. Inside a <script> element "</script" ends it early, and "<!--" followed by
"<script" makes the parser skip the next "</script>" (a run named "<!--<script>" would swallow the page's scripts):
the model's JSON writes every "<" as \\u003c, base64 has no "<", and the scripts are checked to hold neither "</" nor
"<!--" nor "<script". The page's Content-Security-Policy allows inline scripts and styles and data: images, nothing
else: it cannot fetch or load anything.

An earlier export is known by its structure (is_export), not by a string anywhere in it: the template's head, byte
for byte up to its generator tag, at the very start, and the page's own script and closing tags at the very end.
"""

import base64
import json
import re
from importlib import resources

from chargpt.errors import ChargptError

GENERATOR = "chargpt export --format web"  # the page's <meta name="generator">: how --force knows an earlier export
SLOTS = ("TITLE", "STYLE", "DESCRIPTION", "WEIGHTS", "SAMPLING", "DECODER", "PAGE")
UNSAFE_IN_SCRIPT = ("</", "<!--", "<script")  # what could end an inline script early, or hide its end (lower case)
TAIL = 64 * 1024  # the end of a page that holds its own script (page.js, about 10 KB) and closing tags
MARK = {"description": 'id="chargpt-model"', "weights": 'id="chargpt-weights"'}


def asset(name):
    """A file of the package (decoder.js, page.js, page.html, page.css, check.js) as text."""
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def script_safe(text, what):
    found = next((s for s in UNSAFE_IN_SCRIPT if s in text.lower()), None)
    if found:
        raise ChargptError(f"{what} holds {found!r}, which would end its <script> early or hide its end; report it")
    return text


def html_escape(text):
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def render(description, blob):
    """-> the page (str): the model's description (a JSON-able dict) and weights (bytes) embedded."""
    fill = {
        "TITLE": html_escape(description["info"]["name"]),
        "STYLE": asset("page.css"),
        "DESCRIPTION": json.dumps(description, ensure_ascii=False).replace("<", "\\u003c"),  # only in its strings
        "WEIGHTS": base64.b64encode(blob).decode("ascii"),
        "SAMPLING": script_safe(asset("sampling.js"), "sampling.js"),
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


def export_head():
    """The bytes every page starts with: the template up to and including its generator tag."""
    template, tag = asset("page.html"), f'<meta name="generator" content="{GENERATOR}">'
    return template[:template.index(tag) + len(tag)].encode()


def is_export(path):
    """Whether the file at `path` is a page an earlier web export wrote: it starts with the template's head (its
    generator tag where the template has it) and ends with the page's script and closing tags; a file that merely
    quotes the tag (notes showing it in a <pre>) is not one."""
    head = export_head()
    try:
        with open(path, "rb") as f:
            if f.read(len(head)) != head:
                return False
            f.seek(0, 2)
            f.seek(max(len(head), f.tell() - TAIL))
            tail = f.read()
    except OSError:
        return False
    return re.search(rb'<script id="chargpt-page">.*</script>\s*</body>\s*</html>\s*\Z', tail, re.S) is not None
