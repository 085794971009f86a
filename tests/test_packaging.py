"""One distribution, `paralens`, with two import packages, imported from this repository: its
metadata, what its wheel and sdist hold, its declared lowest versions (installed and run), and
its types (mypy)."""

import importlib.metadata
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.version import Version
from setuptools import find_packages

ROOT = Path(__file__).resolve().parent.parent
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _extra(name: str) -> list:
    """The requirements of an extra, with the extras it names (`paralens[docs,...]`) expanded."""
    out = []
    for req in CONFIG["project"]["optional-dependencies"][name]:
        own = re.fullmatch(r"paralens\[([\w,\s-]+)\]", req)
        out += [r for e in own.group(1).split(",") for r in _extra(e.strip())] if own else [req]
    return out


def _index_unreachable() -> str | None:
    """Why pip cannot install from a package index here, or None if it can (one small
    download: pip's own client, with the machine's pip configuration)."""
    if os.environ.get("PIP_NO_INDEX", "").lower() in {"1", "true", "yes", "on"}:
        return "PIP_NO_INDEX is set"
    with tempfile.TemporaryDirectory() as dest:
        probe = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q",
                                "--dest", dest, "--no-cache-dir", "tqdm==4.66.0"],
                               capture_output=True, text=True, timeout=120)
    return None if probe.returncode == 0 else f"pip cannot reach an index: {probe.stderr[-300:]}"


def test_packages_import_from_this_repository():
    import categories
    import lenses

    for module in (categories, lenses):
        assert Path(module.__file__).resolve().is_relative_to(ROOT), module.__file__


def test_distribution_name_and_package_discovery():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert config["project"]["name"] == "paralens"
    find = config["tool"]["setuptools"]["packages"]["find"]
    include = find["include"]
    assert {name.split(".")[0] for name in include} == {"categories", "lenses"}
    found = find_packages(where=str(ROOT), include=include, exclude=find.get("exclude", ()))
    assert {name.split(".")[0] for name in found} == {"categories", "lenses"}
    assert "tests" not in found and "examples" not in found


def test_laws_and_strategies_are_submodules_and_hypothesis_loads_only_when_used():
    code = (
        "import sys, categories\n"
        "assert 'hypothesis' not in sys.modules, 'categories imported hypothesis'\n"
        "assert 'lenses' not in sys.modules, 'categories imported lenses'\n"
        "assert callable(categories.laws.check_rd5)\n"
        "assert 'hypothesis' not in sys.modules, 'categories.laws imported hypothesis'\n"
        "assert callable(categories.strategies.smooth_maps)\n"
        "from categories import laws, strategies\n"
        "assert laws is categories.laws and strategies is categories.strategies\n"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def test_equinox_flax_discopy_and_matplotlib_stay_optional():
    # imported inside the functions that use them, never when the packages are imported;
    # and each is in an extra of its own and in the test extra (CI installs only `.[test]`)
    import ast

    optional = {"equinox", "flax", "discopy", "matplotlib"}
    for path in sorted((ROOT / "lenses").rglob("*.py")) + sorted((ROOT / "categories").rglob("*.py")):
        for node in ast.parse(path.read_text()).body:  # the module's top level only
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert name.split(".")[0] not in optional, f"{path.name} imports {name} at load"
    for extra, package in (("equinox", "equinox"), ("flax", "flax"), ("diagrams", "discopy")):
        assert any(r.startswith(package) for r in _extra(extra)), extra
        assert any(r.startswith(package) for r in _extra("test")), package


def test_the_test_extra_names_the_other_extras_instead_of_repeating_them():
    test = CONFIG["project"]["optional-dependencies"]["test"]
    assert "paralens[docs,examples,equinox,flax,diagrams]" in test
    own = {r for e in ("docs", "examples", "equinox", "flax", "diagrams") for r in _extra(e)}
    assert not own & set(test), own & set(test)


def test_one_version_for_the_distribution_and_both_packages():
    import categories
    import lenses

    assert lenses.__version__ == categories.__version__ == importlib.metadata.version("paralens")
    assert CONFIG["project"]["dynamic"] == ["version"] and "version" not in CONFIG["project"]


def test_the_license_is_spdx_with_its_file():
    assert CONFIG["project"]["license"] == "MIT"
    assert CONFIG["project"]["license-files"] == ["LICENSE"]
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")


@pytest.mark.slow
def test_build_warns_of_nothing_deprecated_and_ships_types_license_and_what_the_tests_read(tmp_path):
    """`python -m build` (an sdist, then the wheel from it): no deprecation warning; the wheel
    holds both py.typed markers and the license; the sdist every tracked file of the
    directories the tests read, so that its tests run."""
    reason = _index_unreachable()  # the isolated build installs setuptools from an index
    if reason:
        pytest.skip(reason)
    run = subprocess.run([sys.executable, "-m", "build", "--outdir", str(tmp_path), str(ROOT)],
                         capture_output=True, text=True, timeout=600)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-4000:]
    assert not re.search(r"deprecat", log, re.I), [l for l in log.splitlines() if re.search("deprecat", l, re.I)]
    version = importlib.metadata.version("paralens")
    wheel = zipfile.ZipFile(tmp_path / f"paralens-{version}-py3-none-any.whl").namelist()
    assert {"lenses/py.typed", "categories/py.typed",
            f"paralens-{version}.dist-info/licenses/LICENSE"} <= set(wheel), wheel
    with tarfile.open(tmp_path / f"paralens-{version}.tar.gz") as sdist:
        held = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
    dirs = ["docs", "examples", "tests", "bench", "paper_notes"]
    tracked = subprocess.run(["git", "ls-files", *dirs], cwd=ROOT, capture_output=True, text=True)
    if tracked.returncode == 0:
        expected = set(tracked.stdout.split())
    else:  # not a git checkout (an unpacked sdist): what is on disk
        expected = {str(p.relative_to(ROOT)) for d in dirs for p in (ROOT / d).rglob("*")
                    if p.is_file() and "__pycache__" not in p.parts}
    assert len(expected) > 100 and not expected - held, sorted(expected - held)[:20]
    _the_sdist_runs_its_own_tests(tmp_path / f"paralens-{version}.tar.gz", tmp_path / "unpacked")


def _the_sdist_runs_its_own_tests(archive, where):
    """The unpacked sdist's tests pass on its own code: the packages import from the unpacked
    tree (`test_packages_import_from_this_repository` there checks it); the spaces' laws; the
    architecture map, which reads ARCHITECTURE.md and every source file the sdist shipped."""
    with tarfile.open(archive) as sdist:
        sdist.extractall(where, filter="data")
    (root,) = where.iterdir()
    chosen = ["tests/test_packaging.py::test_packages_import_from_this_repository",
              "tests/test_packaging.py::test_one_version_for_the_distribution_and_both_packages",
              "tests/test_spaces.py", "tests/test_architecture.py"]
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
                          *chosen], cwd=root, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": str(root)})
    assert run.returncode == 0 and " passed" in run.stdout, (run.stdout + run.stderr)[-3000:]


# the smoke subset: compose, a fit, save and load, a law check (hypothesis)
SMOKE = """
import os, tempfile
import jax, numpy as np
from categories import Positive
from lenses import LogBarrier, adam, check_metric, dense, fit, half_squared_error, load, relu, save

model = dense(2, 8) >> relu >> dense(8, 1)
p = model.init(jax.random.PRNGKey(0))
X = jax.random.normal(jax.random.PRNGKey(1), (128, 2)); Y = X[:, :1] * X[:, 1:]
opt = adam(1e-2)
state, history = fit(model, half_squared_error, opt, p, (X, Y), epochs=5, batch_size=32,
                     key=jax.random.PRNGKey(2), progress=False)
assert history[-1]["loss"] < history[0]["loss"], history
path = os.path.join(tempfile.mkdtemp(), "run.st")
save(path, state, model, opt)
back = load(path, model, opt)
assert all(np.array_equal(a, b) for a, b in zip(jax.tree_util.tree_leaves(back.state.params),
                                                 jax.tree_util.tree_leaves(state.params)))
check_metric(LogBarrier(Positive(2)), Positive(2), examples=3)
import importlib.metadata as m
print({d: m.version(d) for d in ("numpy", "jax", "jaxlib", "optax", "safetensors", "tqdm", "hypothesis")})
"""


def _lowest_pins() -> list:
    """The core dependencies pinned at their declared lower bounds (`name>=v` as `name==v`)."""
    pins = []
    for req in CONFIG["project"]["dependencies"]:
        name, low = re.fullmatch(r"([\w.-]+)>=([\w.]+)", req).groups()
        pins.append(f"{name}=={low}")
    return pins


@pytest.mark.slow
def test_the_declared_lowest_versions_pass_the_smoke_subset(tmp_path):
    """A fresh venv (no system site-packages) with exactly the declared lowest versions of the
    core dependencies (pip resolves only what they need), paralens itself `--no-deps`, runs the
    smoke subset. Measured here: about 30 s with pip's download cache warm, a minute cold."""
    reason = _index_unreachable()
    if reason:
        pytest.skip(reason)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    pins = _lowest_pins()
    for args in (pins, ["--no-deps", "-e", str(ROOT)]):
        run = subprocess.run([python, "-m", "pip", "install", "-q", *args], capture_output=True,
                             text=True, timeout=600)
        assert run.returncode == 0, run.stderr[-4000:]
    smoke = subprocess.run([python, "-c", SMOKE], cwd=tmp_path, capture_output=True, text=True,
                           timeout=600)
    assert smoke.returncode == 0, smoke.stdout[-2000:] + smoke.stderr[-4000:]
    installed = eval(smoke.stdout.strip().splitlines()[-1])  # noqa: S307 - the dict printed above
    for pin in pins:
        name, version = pin.split("==")
        assert Version(installed[name]) == Version(version), (pin, installed)


def test_mypy_finds_no_error_in_either_package():
    """mypy, configured in pyproject.toml ([tool.mypy]: lenses/ and categories/), reports no
    error; a narrow `# type: ignore[code]` carries its reason on its line."""
    pytest.importorskip("mypy", reason="mypy is in the test extra: pip install -e '.[test]'")
    run = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0 and "Success: no issues found" in run.stdout, run.stdout[-6000:]
    for path in [*(ROOT / "lenses").rglob("*.py"), *(ROOT / "categories").rglob("*.py")]:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if "type: ignore" in line:
                assert re.search(r"type: ignore\[[\w-]+\]\s+#\s*\S", line), f"{path.name}:{n}: {line}"


def test_ci_runs_the_readmes_test_command_derandomized():
    """`.ci/run` calls the very command the README gives to run the tests, with CI=true (the
    fixed Hypothesis draw, tests/conftest.py)."""
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"## Run the tests\s+```sh\n(.+?)\n```", readme, re.S)
    assert block, "the README has no 'Run the tests' command"
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert ci[-1] == block.group(1).strip(), (ci[-1], block.group(1))
    assert 'export CI="${CI:-true}"' in ci
