"""The examples run: each script in a subprocess with small settings, each notebook under nbclient.

Scripts must exit 0 and print their key lines; notebooks must execute without an error and
be committed as `examples/make_notebooks.py` writes them: the same sources, executed, with
their outputs; the printed output of the cells it tags `stable` must be what a fresh
execution prints (the other cells print timings and sweeps, which vary).
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
NOTEBOOKS = ("backprop_by_hand.ipynb", "laws.ipynb", "inner_products.ipynb",
             "reparameterisation.ipynb", "open_sets.ipynb", "hyperbolic.ipynb",
             "fisher.ipynb")

slow = pytest.mark.slow  # a few seconds to a minute each: JAX start-up and compilation


def run_script(name, *args, timeout=300):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, str(EXAMPLES / name), *args], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{name} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out.stdout


def epoch_losses(stdout):
    return [float(m) for m in re.findall(r"^epoch +\d+ +loss ([0-9.]+)", stdout, re.M)]


@slow
def test_main_example():
    out = run_script("main.py", "--epochs", "4")
    assert "dense(4→16) ≫ tanh ≫ dense(16→3) : R^4 → R^3" in out
    assert "┤ dense(4→16) ├" in out and "┤ tanh ├" in out  # the text diagram
    assert "order of the forward parts : dense(4→16) → tanh → dense(16→3)" in out
    assert "order of the backward parts: dense(16→3) → tanh → dense(4→16)" in out
    assert "p - p' raises TypeError: a covector is not a point" in out
    assert "its sharp, Diagonal(4)" in out
    assert "equals f at u(p): True" in out
    losses = epoch_losses(out)
    assert len(losses) == 4 and losses[-1] < losses[0]  # it learns
    held_out = float(re.search(r"final accuracy: train [0-9.]+, held-out ([0-9.]+)", out).group(1))
    assert held_out > 0.5  # three balanced classes: chance is 1/3


@slow
@pytest.mark.parametrize("metric,epochs", [("euclidean", 2), ("kfac", 1)])
def test_digits_example(metric, epochs):
    out = run_script("digits.py", "--metric", metric, "--epochs", str(epochs))
    assert "dense(64→128) ≫ relu ≫ dense(128→10)" in out
    assert f"metric {'Euclidean' if metric == 'euclidean' else 'KFAC'}(" in out
    losses = epoch_losses(out)
    assert len(losses) == epochs and all(0 < loss < 2.5 for loss in losses)  # log 10 ≈ 2.3 at chance
    if epochs > 1:
        assert losses[-1] < losses[0]
    acc = float(re.search(r"held-out accuracy: ([0-9.]+)", out).group(1))
    assert acc > 0.5  # ten classes: chance is 0.1


@slow
def test_tiny_lm_example():
    out = run_script("tiny_lm.py", "--steps", "150", "--width", "32", "--layers", "1",
                     "--context", "16", "--batch", "16", "--sample", "40")
    assert "Tokens(16, V=45)" in out and "Keys" in out and "repeat ×1" in out  # the diagram
    assert "┤ attention(4 heads, causal) ├" in out and "dropout(0.1)" in out
    losses = [float(m) for m in re.findall(r"^step +\d+ +loss ([0-9.]+)", out, re.M)]
    assert len(losses) == 10 and losses[-1] < losses[0]
    final = float(re.search(r"final loss \(evaluation, every window\): ([0-9.]+)", out).group(1))
    assert final < 2.4  # the threshold stated in the example's docstring (frequencies alone: 3.0)
    sample = out.split("sample:\n", 1)[1]
    # the prompt, then the 40 sampled characters (newlines among them), then print's newline
    assert sample.startswith("The Zen of Pytho") and len(sample) == 16 + 40 + 1


def test_digits_offers_the_metrics_that_exist():
    import lenses

    sys.path.insert(0, str(EXAMPLES))
    try:
        import digits
    finally:
        sys.path.remove(str(EXAMPLES))
    for name, present in (("fisher", hasattr(lenses, "Fisher")), ("kfac", hasattr(lenses, "KFAC"))):
        assert (name in digits.METRICS) == present
    assert {"euclidean", "diagonal"} <= set(digits.METRICS)


@slow
def test_conv_digits_example():
    out = run_script("conv_digits.py", "--epochs", "2", "--channels", "4")
    assert "┤ conv2d(1→4, 3×3) ├" in out and "max_pool(2×2)" in out and "R^{4×4×4}" in out
    losses = epoch_losses(out)
    assert len(losses) == 2 and losses[1] < losses[0]
    assert float(re.search(r"held-out accuracy: ([0-9.]+)", out).group(1)) > 0.3


@slow
def test_xor_example(tmp_path):
    out = run_script("xor.py", "--steps", "600", "--out", str(tmp_path))
    assert "┤ dense(2→2) ├" in out and "┤ tanh ├" in out  # its string diagram
    affine = float(re.search(r"affine dense\(2,1\) +final loss ([0-9.]+)", out).group(1))
    net = float(re.search(r"dense\(2,1\) final loss ([0-9.]+)", out).group(1))
    assert abs(affine - 0.125) < 1e-3  # the least-squares affine fit of XOR: the constant 1/2
    assert net < 1e-3
    preds = re.findall(r"xor\((\d), (\d)\) = (\d) +network ([-+0-9.]+)", out)
    assert len(preds) == 4 and all(abs(float(o) - (int(a) ^ int(b))) < 0.1 for a, b, _, o in preds)
    assert (tmp_path / "xor.png").stat().st_size > 0 and (tmp_path / "xor_diagram.png").exists()


@slow
def test_tied_autoencoder_example(tmp_path):
    out = run_script("tied_autoencoder.py", "--hidden", "8", "--epochs", "3", "--out", str(tmp_path))
    assert "untied parameters 1024, tied parameters 512" in out
    gap, scale = map(float, re.search(r"differ by at most ([0-9.e+-]+) \(entries up to ([0-9.e+-]+)\)",
                                      out).groups())
    assert gap <= 1e-6 * scale  # the tied covector is the sum of the two uses
    alone = [float(v) for v in re.findall(r"‖W' − [^‖]+‖∞ = ([0-9.e+-]+)", out)]
    assert len(alone) == 2 and min(alone) > 1e-3 * scale  # and neither use alone
    losses = epoch_losses(out)
    assert len(losses) == 3 and losses[-1] < losses[0]
    assert (tmp_path / "tied_autoencoder.png").exists()


@slow
def test_residual_example(tmp_path):
    out = run_script("residual.py", "--depths", "1", "4", "16", "--seeds", "1", "--out", str(tmp_path))
    rows = {int(d): (float(a), float(b)) for d, a, b in
            re.findall(r"^ +(\d+) +([0-9.e+-]+) +([0-9.e+-]+)$", out, re.M)}
    assert set(rows) == {1, 4, 16} and rows[1] == (1.0, 1.0)
    assert rows[16][0] < 1e-6  # the plain chain: geometric decay (σ' ≤ 1/4 per layer)
    assert rows[16][1] > 1e-2  # the identity path carries the covector back
    assert (tmp_path / "residual.png").exists()


@slow
def test_dream_example(tmp_path):
    out = run_script("dream.py", "--epochs", "15", "--out", str(tmp_path))
    m = re.search(r"the network calls it a (\d) \(P\(8\) = ([0-9.]+)\); every pixel in \(0, 1\): True", out)
    assert m and m.group(1) == "8" and float(m.group(2)) >= 0.5
    assert (tmp_path / "dream.png").exists()


def _make_notebooks():
    sys.path.insert(0, str(EXAMPLES))
    try:
        import make_notebooks
    finally:
        sys.path.remove(str(EXAMPLES))
    return make_notebooks


def test_notebooks_are_committed_as_generated_with_their_outputs():
    nbformat = pytest.importorskip("nbformat")
    make_notebooks = _make_notebooks()
    assert set(make_notebooks.NOTEBOOKS) == set(NOTEBOOKS)
    for name in NOTEBOOKS:
        committed = nbformat.read(EXAMPLES / name, as_version=4)
        generated = make_notebooks.build(name)
        assert [c.source for c in committed.cells] == [c.source for c in generated.cells], \
            f"{name} differs from make_notebooks.py: run python examples/make_notebooks.py"
        assert [c.get("metadata", {}).get("tags") for c in committed.cells] == \
            [c.get("metadata", {}).get("tags") for c in generated.cells], f"{name}: tags differ"
        for cell in committed.cells:
            if cell.cell_type != "code":
                continue
            assert cell.execution_count is not None, f"{name} is committed unexecuted"
            assert not [o for o in cell.outputs if o.output_type == "error"], f"{name} has an error"
            assert "execution" not in cell.metadata, f"{name} keeps timing metadata"
            if "stable" in cell.metadata.get("tags", []):  # "" == "" would be no check
                assert make_notebooks.stable_text(cell), f"{name}: a stable cell without output"
            if "plt.show()" in cell.source:
                assert any("image/png" in o.get("data", {}) for o in cell.outputs), \
                    f"{name}: a figure cell without its figure"


def test_readme_figures_exist_and_are_small():
    readme = (ROOT / "README.md").read_text()
    figures = re.findall(r"\((examples/figures/[\w.]+\.png)\)", readme)
    assert len(figures) >= 3
    for path in figures:
        size = (ROOT / path).stat().st_size
        assert 0 < size < 200_000, f"{path}: {size} bytes"


@slow
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_executes(name):
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("nbclient")
    make_notebooks = _make_notebooks()
    committed = nbformat.read(EXAMPLES / name, as_version=4)
    # The "python3" kernel is ipykernel's own spec; jupyter_client starts it with this
    # interpreter (sys.executable), so it sees the same packages as the tests.
    nb = make_notebooks.execute(make_notebooks.build(name))  # raises on the first failing cell
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    for fresh, kept in zip(nb.cells, committed.cells):
        if "stable" in fresh.metadata.get("tags", []):
            assert make_notebooks.stable_text(fresh) == make_notebooks.stable_text(kept), \
                f"{name}: the committed output of a stable cell is not what it prints now:\n{fresh.source[:200]}"


# -- the documentation points at things that exist ---------------------------------------------

def test_paper_notes_cite_only_tests_that_exist():
    defined = {}
    for path in (ROOT / "tests").glob("test_*.py"):
        for name in re.findall(r"^def (test_\w+)", path.read_text(), re.M):
            defined.setdefault(name, set()).add(path.name)
    notes = sorted((ROOT / "paper_notes").glob("*.md"))
    assert len(notes) >= 9  # eight ideas and the index
    for note in notes:
        text = note.read_text()
        for file in re.findall(r"tests/(test_\w+\.py)", text):
            assert (ROOT / "tests" / file).exists(), f"{note.name} cites a missing file tests/{file}"
        for file, name in re.findall(r"tests/(test_\w+\.py)::(test_\w+)", text):
            assert file in defined.get(name, ()), f"{note.name} cites {file}::{name}, which does not exist"
        for name in re.findall(r"`(test_\w+)`", text):
            assert name in defined, f"{note.name} cites {name}, which no test file defines"


def test_readme_commands_are_the_two_set_up_commands_and_ci_runs_the_second():
    readme = (ROOT / "README.md").read_text()
    run_main = ("python3 -m venv .venv && .venv/bin/pip install -e '.[examples]' && "
                ".venv/bin/python examples/main.py")
    run_tests = ("python3 -m venv .venv && .venv/bin/pip install -q -e '.[test]' && "
                 ".venv/bin/python -m pytest")
    assert run_main in readme and run_tests in readme
    ci = ROOT / ".ci" / "run"
    if ci.exists():
        assert run_tests in ci.read_text()


def test_the_readme_quick_start_runs():
    readme = (ROOT / "README.md").read_text()
    start = readme.index("```python\nimport jax, jax.numpy")
    code = readme[start + len("```python\n"):readme.index("```", start + 10)]
    scope = {}
    exec(compile(code, "README.md quick start", "exec"), scope)
    assert scope["history"][-1]["loss"] < scope["history"][0]["loss"]
