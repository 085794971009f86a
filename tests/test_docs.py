"""The documentation site (mkdocs.yml, docs/): the API reference lists every public name, the
tests the pages cite exist, every Extending page's example runs and trains, every Training and
ecosystem page's snippets run, and the site builds in strict mode (a broken reference, a
missing page or any warning fails the build).

A python block that cannot run here (one that needs several processes) is marked by the line
`<!-- not run: why -->` right above it."""

import json
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
SHOWN_OUTPUT = re.compile(r"\s*```text\n(.*?)```", re.S)
THEORY = sorted(p for p in (DOCS / "theory").glob("*.md") if p.name != "index.md")
PAGES = [DOCS / "getting-started.md", DOCS / "inner-products" / "index.md",
         DOCS / "reference" / "index.md"]


def _runnable(text: str) -> list:
    """The page's python blocks, in order, less those marked `<!-- not run: ... -->`."""
    return [m.group(1) for m in PYTHON_BLOCK.finditer(text)
            if not text[:m.start()].rstrip().rsplit("\n", 1)[-1].startswith(NOT_RUN)]


def _blocks(text: str) -> list:
    """The page's runnable python blocks, in order, each with the output the page shows for
    it (a ```text block right after it) or None."""
    blocks = []
    for m in PYTHON_BLOCK.finditer(text):
        if text[:m.start()].rstrip().rsplit("\n", 1)[-1].startswith(NOT_RUN):
            continue
        shown = SHOWN_OUTPUT.match(text, m.end())
        blocks.append((m.group(1), shown.group(1) if shown else None))
    return blocks


def _run(blocks: list, namespace: dict, where: str) -> None:
    """Runs the blocks in order in one namespace. Where the page shows outputs, in a fresh
    process as a reader runs them (float32: the suite runs in x64), and each block must print
    exactly what the page shows for it."""
    if all(shown is None for _, shown in blocks):
        for i, (source, _) in enumerate(blocks):
            exec(compile(source, f"{where} (python block {i + 1})", "exec"), namespace)
        return
    program = ("import json, sys\nns = {'__name__': '__main__'}\n"
               "for i, source in enumerate(json.loads(sys.stdin.read())):\n"
               f"    exec(compile(source, f'{where} (python block {{i + 1}})', 'exec'), ns)\n"
               f"    print({_END!r}, flush=True)\n")
    run = subprocess.run([sys.executable, "-c", program], input=json.dumps([b for b, _ in blocks]),
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    printed = run.stdout.split(_END + "\n")
    for i, (_, shown) in enumerate(blocks):
        if shown is not None:
            assert printed[i] == shown, (
                f"{where}, python block {i + 1} prints\n{printed[i]}\nbut the page shows\n{shown}")


_END = "<end of a docs block>"


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


@pytest.mark.parametrize("page", [  # a page that shows outputs runs in a process of its own
    pytest.param(p, marks=pytest.mark.slow) if SHOWN_OUTPUT.search(p.read_text()) else p
    for p in PAGES + THEORY], ids=lambda p: str(p.relative_to(DOCS)))
def test_page_examples_run_and_print_what_the_page_shows(page, tmp_path, monkeypatch):
    """The page's python blocks, in order, as one program (a theory page after the setup of
    docs/theory/index.md); where the page shows a block's output, the block prints it."""
    blocks = _blocks(page.read_text())
    assert blocks
    if page.name == "getting-started.md":  # it shows what each block prints
        assert all(shown is not None for _, shown in blocks)
    if page.parent.name == "theory":
        blocks = _blocks((DOCS / "theory" / "index.md").read_text()) + blocks
    monkeypatch.chdir(tmp_path)
    _run(blocks, {"__name__": f"docs_{page.stem}"}, str(page.relative_to(ROOT)))


README_BLOCKS = _blocks((ROOT / "README.md").read_text())


@pytest.mark.parametrize("i", [
    pytest.param(0, id="quick-start"),
    pytest.param(1, id="equinox-kfac"),
])
def test_readme_block_runs(i, tmp_path, monkeypatch):
    """Each python block of the README, on its own (each is written to be pasted alone)."""
    assert len(README_BLOCKS) == 2  # the multi-process block is marked not run
    monkeypatch.chdir(tmp_path)
    _run([README_BLOCKS[i]], {"__name__": "readme"}, f"README.md (block {i + 1})")


def test_every_page_with_python_blocks_is_run():
    run = set(EXTENDING + TRAINING + PAGES + THEORY) | {DOCS / "training" / "index.md",
                                                       DOCS / "ecosystem.md",
                                                       DOCS / "theory" / "index.md"}
    with_blocks = {p for p in DOCS.rglob("*.md") if PYTHON_BLOCK.search(p.read_text())}
    assert not with_blocks - run, f"pages whose python blocks no test runs: {with_blocks - run}"


def test_only_blocks_that_need_several_processes_are_not_run():
    marked = [(page.relative_to(ROOT), line) for page in [*DOCS.rglob("*.md"), ROOT / "README.md"]
              for line in page.read_text().splitlines() if line.startswith(NOT_RUN)]
    assert sorted(str(p) for p, _ in marked) == ["README.md", "docs/training/devices.md"], marked


def test_every_notebook_of_the_examples_is_on_the_site():
    # each page is a link to the notebook in examples/ (one copy, kept by make_notebooks.py)
    on_site = {p.name: p for p in DOCS.rglob("*.ipynb")}
    assert sorted(on_site) == sorted(p.name for p in (ROOT / "examples").glob("*.ipynb"))
    nav = (ROOT / "mkdocs.yml").read_text()
    for name, page in on_site.items():
        assert page.is_symlink() and page.resolve() == (ROOT / "examples" / name).resolve(), page
        assert str(page.relative_to(DOCS)) in nav, f"{name} is not in mkdocs.yml's nav"


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
                 "inner-products/inner_products/index.html", "inner-products/fisher/index.html",
                 "inner-products/hyperbolic/index.html"]:
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
