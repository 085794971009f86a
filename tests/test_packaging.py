"""One distribution, `paralens`, with two import packages, imported from this repository."""

import subprocess
import sys
import tomllib
from pathlib import Path

from setuptools import find_packages

ROOT = Path(__file__).resolve().parent.parent


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


def test_laws_and_strategies_are_submodules_and_hypothesis_stays_optional():
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
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra, package in (("equinox", "equinox"), ("flax", "flax"), ("diagrams", "discopy")):
        assert any(r.startswith(package) for r in extras[extra]), extra
        assert any(r.startswith(package) for r in extras["test"]), package
