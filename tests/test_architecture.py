"""The map for the next engineer: every file path and public name ARCHITECTURE.md mentions
exists, and the README links to it."""

import builtins
import re
from pathlib import Path

import importlib
import pkgutil

import jax
from jax import lax

import categories
import lenses
from lenses import LossFamily, Metric, ParaLens, TrainState, TrainStep

ROOT = Path(__file__).resolve().parents[1]
TEXT = (ROOT / "ARCHITECTURE.md").read_text()
SPANS = re.findall(r"`([^`]+)`", TEXT)
PATH = re.compile(r"^[\w./-]+\.(py|md)(::\w+)?$")
NAME = re.compile(r"^([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(\(.*\))?$")


# where a name may live: the packages, their modules (internals the map names), the protocol,
# and the libraries the map refers to; "lens.", "step." and "state." stand for instances
MODULES = [importlib.import_module(m.name)
           for pkg in (lenses, categories)
           for m in pkgutil.walk_packages(pkg.__path__, prefix=pkg.__name__ + ".")
           if not m.name.endswith(".strategies")]
SCOPE = {"lenses": lenses, "categories": categories, "jax": jax, "lax": lax, "lens": ParaLens,
         "step": TrainStep, "state": TrainState}


def _resolve(dotted: str):
    head, *rest = dotted.split(".")
    if head in SCOPE:
        head, *rest = [None] + rest if not rest else rest
        owners = [SCOPE[dotted.split(".")[0]]]
        if head is None:
            return True
    else:
        owners = [lenses, categories, ParaLens, LossFamily, Metric, builtins, *MODULES]
    for owner in owners:
        if hasattr(owner, head) or head in getattr(owner, "__annotations__", {}):
            obj = getattr(owner, head, None)
            for attr in rest:
                if obj is None or not (hasattr(obj, attr) or attr in getattr(obj, "_fields", ())):
                    return False
                obj = getattr(obj, attr, None)
            return True
    return False


def test_every_path_the_map_mentions_exists():
    paths = [s for s in SPANS if PATH.match(s)]
    assert len(paths) > 20
    for span in paths:
        file, _, test = span.partition("::")
        assert (ROOT / file).exists(), f"ARCHITECTURE.md mentions {file}, which does not exist"
        if test:
            assert re.search(rf"^def {test}\b", (ROOT / file).read_text(), re.M), \
                f"ARCHITECTURE.md cites {span}, which does not exist"


def test_every_name_the_map_mentions_exists():
    names = [NAME.match(s).group(1) for s in SPANS if not PATH.match(s) and NAME.match(s)]
    assert len(names) > 40
    missing = [n for n in names if not _resolve(n)]
    assert not missing, f"ARCHITECTURE.md mentions names that do not exist: {missing}"
    # the names of the public API it mentions are public
    public = set(lenses.__all__) | set(categories.__all__)
    mentioned = {n for n in names if "." not in n and n[0].isupper() and hasattr(lenses, n)}
    assert mentioned <= public | {"ParaLens"}, mentioned - public


def test_the_readme_links_the_map():
    assert "ARCHITECTURE.md" in (ROOT / "README.md").read_text()


def test_the_training_engine_reads_as_small_parts():
    """lenses/training/: no function over 60 lines, no class over 300 (docstrings included),
    and nothing outside the module that owns `TrainStep` and `TrainState` reaches into their
    private fields (`step._core`, `state._...`) but the engine's own modules."""
    import ast

    engine = ROOT / "lenses" / "training"
    for path in engine.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                length = node.end_lineno - node.lineno + 1
                limit = 300 if isinstance(node, ast.ClassDef) else 60
                assert length <= limit, f"{path.name}: {node.name} has {length} lines"
    for path in [*ROOT.glob("lenses/*.py"), *ROOT.glob("examples/*.py"), *ROOT.glob("bench/*.py")]:
        text = path.read_text()
        assert "._core" not in text and "._hyper" not in text, path
