"""Build hooks of the documentation site (mkdocs.yml `hooks:`): maths typeset offline.

MathJax is served from the installed `django-static-mathjax` package (the `docs` extra), never
fetched: `on_files` adds its single-file build to the site. Markdown pages have their maths
marked by pymdownx.arithmatex (generic mode: `\\(...\\)` and `\\[...\\]` in `arithmatex`
elements); notebook pages are rendered by nbconvert, which leaves `$...$` as written, so
`on_page_content` marks their maths the same way, outside code and outputs printed as text.
"""

from __future__ import annotations

import importlib.resources
import re

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

MATHJAX = "assets/mathjax/tex-svg-full.js"  # every TeX extension inside: nothing to autoload

# regions left as they are: code, printed outputs, scripts and styles
_VERBATIM = re.compile(r"(<(pre|code|script|style)\b.*?</\2>)", re.S)
_DISPLAY = re.compile(r"\$\$(.+?)\$\$", re.S)
_INLINE = re.compile(r"(?<![\\$])\$(?!\s)([^$]+?)(?<![\s\\])\$(?!\d)")


def on_files(files, config):
    try:
        source = importlib.resources.files("mathjax") / "static/mathjax/es5/tex-svg-full.js"
        path = str(source)
        if not source.is_file():
            raise FileNotFoundError(path)
    except (ModuleNotFoundError, FileNotFoundError) as e:
        raise PluginError("the site serves MathJax from the package django-static-mathjax: "
                          "pip install -e '.[docs]'") from e
    files.append(File.generated(config, MATHJAX, abs_src_path=path))
    return files


def typeset_ready(text: str) -> str:
    """Text of a rendered notebook with `$$x$$` and `$x$` outside code as arithmatex's
    `<div class="arithmatex">\\[x\\]</div>` and `<span class="arithmatex">\\(x\\)</span>`."""
    parts = _VERBATIM.split(text)
    out = []
    i = 0
    while i < len(parts):
        out.append(_mark(parts[i]))
        if i + 1 < len(parts):
            out.append(parts[i + 1])  # the verbatim region, then its tag name (dropped)
        i += 3
    return "".join(out)


def _mark(text: str) -> str:
    text = _DISPLAY.sub(lambda m: f'<div class="arithmatex">\\[{m.group(1)}\\]</div>', text)
    return _INLINE.sub(lambda m: f'<span class="arithmatex">\\({m.group(1)}\\)</span>', text)


# nbconvert's own MathJax 2 loader (an empty src and a configuration MathJax 3 ignores)
_NBCONVERT_MATHJAX = re.compile(r"<!-- Load mathjax -->.*?<!-- End of mathjax configuration -->", re.S)


def on_page_content(content, page, config, files):
    if page.file.src_uri.endswith(".ipynb"):
        return typeset_ready(_NBCONVERT_MATHJAX.sub("", content))
    return content
