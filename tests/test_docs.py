"""The documentation site (mkdocs.yml, docs/): the API reference lists every public name, the
tests the pages cite exist, every Extending page's example runs and trains, every Training and
ecosystem page's snippets run, and the site builds in strict mode (a broken reference, a
missing page or any warning fails the build).

A python block that cannot run here (one that needs several processes) is marked by the line
`<!-- not run: why -->` right above it."""

import pathlib
import re
import subprocess
import sys

import matplotlib
import pytest

import categories
import lenses

matplotlib.use("Agg")

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
REFERENCE = re.compile(r"^::: ((?:categories|lenses)\.\w+)\s*$", re.M)
CITED_TEST = re.compile(r"`(tests/test_\w+\.py)::(test_\w+)`")
PYTHON_BLOCK = re.compile(r"```python\n(.*?)```", re.S)
EXTENDING = sorted(p for p in (DOCS / "extending").glob("*.md") if p.name != "index.md")
TRAINING = sorted(p for p in (DOCS / "training").glob("*.md") if p.name != "index.md")
NOT_RUN = "<!-- not run:"


def _runnable(text: str) -> list:
    """The page's python blocks, in order, less those marked `<!-- not run: ... -->`."""
    return [m.group(1) for m in PYTHON_BLOCK.finditer(text)
            if not text[:m.start()].rstrip().rsplit("\n", 1)[-1].startswith(NOT_RUN)]


def _reference_entries():
    return {name for page in (DOCS / "reference").glob("*.md") for name in REFERENCE.findall(page.read_text())}


def test_the_reference_lists_every_public_name():
    # the required names come from the two __all__ lists, so a name added there is missed here
    public = {f"{p.__name__}.{n}" for p in (categories, lenses) for n in p.__all__}
    listed = _reference_entries()
    missing = sorted(public - listed)
    assert not missing, f"public names missing from docs/reference/*.md: {missing}"
    modules = {"categories.laws", "categories.strategies", "lenses.laws", "lenses.strategies"}
    stale = sorted(listed - public - modules)
    assert not stale, f"docs/reference/*.md lists names that are not public: {stale}"


def test_every_test_the_pages_cite_exists():
    cited = [(page, file, test) for page in DOCS.rglob("*.md")
             for file, test in CITED_TEST.findall(page.read_text())]
    assert len(cited) > 20
    missing = [f"{page.relative_to(ROOT)}: {file}::{test}" for page, file, test in cited
               if not (ROOT / file).exists()
               or not re.search(rf"^def {test}\b", (ROOT / file).read_text(), re.M)]
    assert not missing, f"the docs cite tests that do not exist: {missing}"


def test_there_are_five_extending_pages_each_with_an_example():
    assert [p.stem for p in EXTENDING] == ["combinator", "inner-product", "layer", "loss",
                                           "optimiser-part"]
    assert all(PYTHON_BLOCK.search(p.read_text()) for p in EXTENDING)


@pytest.mark.parametrize("page", EXTENDING, ids=lambda p: p.stem)
def test_extending_page_example_runs_and_trains(page, capsys):
    """The page's python blocks, in order, as one program: each ends by asserting that the new
    thing trained a small model (the loss fell), after checking it by hand or against jax.grad."""
    source = "\n".join(_runnable(page.read_text()))
    assert "train_step" in source and "assert" in source
    exec(compile(source, str(page), "exec"), {"__name__": f"docs_{page.stem}"})
    assert "→" in capsys.readouterr().out  # it printed the loss before and after training


@pytest.fixture(scope="module")
def training_setup():
    """The setup on docs/training/index.md (a small model and data), run once: the pages share
    its model, so equal steps share their compilations (`train_step`) as a reader's would."""
    namespace = {"__name__": "docs_training"}
    exec(compile("\n".join(_runnable((DOCS / "training" / "index.md").read_text())),
                 "docs/training/index.md", "exec"), namespace)
    return namespace


@pytest.mark.parametrize("page", TRAINING + [DOCS / "ecosystem.md"], ids=lambda p: p.stem)
def test_training_page_examples_run(page, training_setup, tmp_path, monkeypatch):
    """The page's python blocks, in order, after the setup, as one program; each page asserts
    what it claims (a run equal to the calls, the fault's kind, step and slot, a resumed run
    equal to the whole one, a module back from its lens, ...)."""
    blocks = _runnable(page.read_text())
    assert blocks and any("assert" in b for b in blocks)
    monkeypatch.chdir(tmp_path)  # saved work writes its files here
    exec(compile("\n".join(blocks), str(page), "exec"), dict(training_setup))


def test_only_blocks_that_need_several_processes_are_not_run():
    marked = [(page.relative_to(ROOT), line) for page in DOCS.rglob("*.md")
              for line in page.read_text().splitlines() if line.startswith(NOT_RUN)]
    assert [str(p) for p, _ in marked] == ["docs/training/devices.md"], marked


def test_the_readme_gives_the_docs_command_as_the_third_optional_one():
    readme = (ROOT / "README.md").read_text()
    command = ("python3 -m venv .venv && .venv/bin/pip install -q -e '.[docs]' && "
               ".venv/bin/mkdocs serve")
    assert command in readme
    assert readme.index("## Run the tests") < readme.index(command)


def test_the_site_builds_in_strict_mode(tmp_path):
    # not --quiet: it hides the warnings strict mode counts; the log is read for them here too
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                          "--site-dir", str(tmp_path / "site")],
                         cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"})
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-4000:]
    warnings = [line for line in log.splitlines() if "WARNING" in line]
    assert not warnings, "\n".join(warnings)
    for page in ["index.html", "reference/layers/index.html", "extending/layer/index.html",
                 "inner-products/inner_products/index.html"]:
        assert (tmp_path / "site" / page).exists(), page
    # the reference shows the docstring examples, and the notebooks come with their outputs
    assert "lenses.dense" in (tmp_path / "site/reference/layers/index.html").read_text()
    assert "<img" in (tmp_path / "site/inner-products/inner_products/index.html").read_text()
    # maths marked for MathJax (arithmatex's form) on a theory page and a notebook page, no
    # `$` left outside code on any page, and MathJax served by the site itself
    site = tmp_path / "site"
    for page, formula in [("theory/sharp-and-update/index.html", r"\(g_p((p')^\sharp, v) = p'(v)\)"),
                          ("theory/backward-part/index.html", "\\[\nf' : A \\times P"),
                          ("theory/laws/index.html", r"\((B \circ A)^* = A^* \circ B^*\)"),
                          ("inner-products/inner_products/index.html", r"\(u(p) = p - \eta")]:
        text = (site / page).read_text()
        assert re.search(r'<(span|div) class="arithmatex">' + re.escape(formula), text), page
    for page in site.rglob("*.html"):
        text = page.read_text()
        assert not re.findall(r"\$", _OUTSIDE_CODE.sub("", text)), f"raw $ in {page}"
        for src in re.findall(r'<script[^>]* src="([^"]*)"', text):
            assert src and not re.match(r"\w+:|//", src), f"{page} loads {src!r}"
    assert (site / "assets/mathjax/tex-svg-full.js").stat().st_size > 10**6


# what MathJax leaves alone: code, printed outputs, scripts, styles, and the maths it typesets
_OUTSIDE_CODE = re.compile(r'<(pre|code|script|style|textarea)\b.*?</\1>|'
                           r'<(span|div) class="arithmatex">.*?</\2>', re.S)
