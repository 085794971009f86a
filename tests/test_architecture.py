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


# -- the source, walked: one door per module, no cycle, small modules --------------------------

import ast  # noqa: E402

import jax.numpy as jnp  # noqa: E402

PACKAGES = ("categories", "lenses")
SOURCES = sorted(p for d in (*PACKAGES, "tests") for p in (ROOT / d).rglob("*.py"))
NAMEDTUPLE_API = {"_replace", "_fields", "_asdict", "_make", "_field_defaults"}


def _private(name: str) -> bool:
    """A name private to its module: one leading underscore, not a dunder, and not IPython's
    display protocol (`_repr_svg_`, `_repr_latex_`, ...), which is public by convention."""
    return name.startswith("_") and not name.startswith("__") and not name.endswith("_")


def _defined(tree: ast.AST) -> set:
    """Every name a module defines or binds: functions, classes, assigned names and attributes
    (`self._x = ...`), arguments, import aliases. A private name the module itself defines is
    its own to read, on any object (a sibling instance, a subclass's override)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.attr)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
    return names


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _absolute(path: Path, node: ast.ImportFrom) -> str:
    """The module an `from ... import` reads from, relative imports resolved."""
    if not node.level:
        return node.module or ""
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _private_module(dotted: str, importer: str) -> bool:
    """A module under a private component (`categories._version`) read from outside the
    package that holds it."""
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        package = ".".join(parts[:i])
        if _private(part) and importer != package and not importer.startswith(package + "."):
            return True
    return False


def _members(cls: ast.ClassDef) -> set:
    """What a class declares: its methods and properties, its class attributes, and the
    attributes its methods set on `self`."""
    names = set()
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
            names |= {t.attr for sub in ast.walk(node) if isinstance(sub, ast.Assign)
                      for target in sub.targets for t in ast.walk(target)
                      if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
                      and t.value.id == "self"}
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def _protocol_members() -> set:
    """The members of the protocol's base classes (methods, properties, class and instance
    attributes), and the optional capabilities the code has probed for. Names an array has
    too (`shape`, `dtype`, ...) are left out: asking an object for one asks whether it is an
    array, which is not a capability of the protocol."""
    bases = {"categories/spaces.py": {"Space"}, "categories/smooth.py": {"Smooth"},
             "categories/para.py": {"Para"},
             "lenses/para_lens.py": {"ParaLens"}, "lenses/families.py": {"LensFamily"},
             "lenses/losses/family.py": {"LossFamily"},
             "lenses/inner_products/metrics.py": {"Metric"},
             "lenses/optimisers/lens.py": {"Optimiser"}, "lenses/optimisers/parts.py": {"Part"}}
    members = {"after", "lift", "is_fixed", "endo", "discrete", "at_evaluation", "section",
               "one_slot", "parts", "retract", "stateful", "slots"}
    for file, classes in bases.items():
        path = ROOT / file
        if not path.exists():  # a protocol file moved: its classes are found where they are
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.name in classes:
                members |= {n for n in _members(node) if not n.startswith("_")}
    return members - set(dir(jnp.zeros(()))) - {n for n in members if n.isupper()}


# getattr/hasattr probes that name a protocol member but ask something else, each with its
# reason: (file, the object probed as written, the name)
PROBES_ALLOWED = {
    # a JAX tree path's entry (DictKey.key, SequenceKey.idx, GetAttrKey.name), not a lens
    ("lenses/bridges/external.py", "k", "key"): "a key of a JAX tree path",
    ("lenses/bridges/external.py", "k", "name"): "an attribute name of a JAX tree path",
    # foreign objects accepted where the library's own classes are asked for, read by what
    # they have: an optax transformation as a part, an object with a sharp map as an inner
    # product (wrapped as `Borrowed`), and that object's own optional retract
    ("lenses/optimisers/parts.py", "x", "init"): "an optax transformation's init",
    ("lenses/optimisers/parts.py", "x", "update"): "an optax transformation's update",
    ("lenses/optimisers/parts.py", "metric", "sharp"): "a foreign object's sharp map",
    ("lenses/inner_products/metrics.py", "self.given", "retract"): "a borrowed object's retract",
}

# imports of another library's private module that stay, each with its reason: (file, module)
PRIVATE_MODULES_ALLOWED = {
    # JAX has no public hook that sees each operation dispatched outside jit; the test that
    # fit dispatches nothing while a chunk is in flight patches the one function they pass
    ("tests/test_fit.py", "jax._src.dispatch"): "counts JAX's operations outside jit",
}


def _string(node) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _doors(path: Path, members: set) -> list:
    """The places in one file that open another module's private door or probe the protocol:
    (line, what)."""
    tree = ast.parse(path.read_text())
    own, here = _defined(tree), _module_name(path)
    rel, found = str(path.relative_to(ROOT)), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) and \
                node.attr not in own and node.attr not in NAMEDTUPLE_API and \
                not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            found.append((node.lineno, f"reads the private attribute .{node.attr}"))
        elif isinstance(node, ast.ImportFrom):
            module = _absolute(path, node)
            for alias in node.names:
                if _private(alias.name) and module != here:
                    found.append((node.lineno, f"imports the private name {alias.name} from "
                                               f"{module}"))
            if _private_module(module, here):
                found.append((node.lineno, f"imports from the private module {module}"))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, f"imports the private module {a.name}") for a in node.names
                      if _private_module(a.name, here)
                      and (rel, a.name) not in PRIVATE_MODULES_ALLOWED]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id in ("getattr", "hasattr") and len(node.args) >= 2:
            name = _string(node.args[1])
            if name in members and \
                    (rel, ast.unparse(node.args[0]), name) not in PROBES_ALLOWED:
                found.append((node.lineno, f"{node.func.id}(..., {name!r}) probes the protocol"))
    return found


def _violations(paths) -> dict:
    members = _protocol_members()
    out = {}
    for path in paths:
        found = _doors(path, members)
        if found:
            out[str(path.relative_to(ROOT))] = found
    return out


def _report(violations: dict) -> str:
    return "\n".join(f"{file}:{line}: {what}" for file, found in violations.items()
                     for line, what in found)


def test_no_module_opens_another_modules_private_door():
    """No file of categories/, lenses/ or tests/ reads another module's private attribute
    (`x._name` where x is not self or cls and the module does not define `_name`), imports
    another module's private name (or from another package's private module), or probes an
    object with getattr/hasattr for a member of the protocol (which the base classes declare
    with their defaults) outside `PROBES_ALLOWED`."""
    violations = _violations(SOURCES)
    assert not violations, "private doors opened:\n" + _report(violations)


def test_the_door_check_finds_a_planted_private_read(tmp_path):
    planted = ROOT / "tests" / "_planted_door.py"
    planted.write_text("from lenses.para_lens import _nothing\n"
                       "def f(step):\n    return step._core, self_ok(step)\n"
                       "def self_ok(x):\n    return hasattr(x, 'lift'), x._replace()\n"
                       "class A:\n    def g(self, other):\n"
                       "        self._mine = 1\n        return self._x, other._mine\n")
    try:
        found = [what for _, what in _doors(planted, _protocol_members())]
    finally:
        planted.unlink()
    assert found == ["imports the private name _nothing from lenses.para_lens",
                     "reads the private attribute ._core",
                     "hasattr(..., 'lift') probes the protocol"], found


def _imports(path: Path, modules: set) -> set:
    """The modules of `modules` that `path` imports, at module level or inside a function;
    `from package import name` counts as an import of package.name when that is a module.
    Imports under `if TYPE_CHECKING:` are left out: they are read by a type checker, never run."""
    here, found = _module_name(path), set()
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
                   for stmt in node.body for n in ast.walk(stmt)}
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                found |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & modules
        elif isinstance(node, ast.ImportFrom):
            module = _absolute(path, node)
            submodules = {f"{module}.{a.name}" for a in node.names} & modules
            found |= submodules
            if module in modules and len(submodules) < len(node.names):
                found.add(module)  # a name of the package itself: its __init__ is read
    return found - {here}


def _cycles(graph: dict) -> list:
    """Each strongly connected component of more than one module, as one cycle through it
    (Tarjan's algorithm, then a path back to the start within the component)."""
    index, low, stack, on, comps = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    cycles = []
    for comp in comps:
        start = min(comp)
        paths = {start: [start]}
        frontier = [start]
        while frontier:  # breadth first: the shortest cycle through `start`
            v = frontier.pop(0)
            for w in sorted(graph[v] & comp):
                if w == start:
                    cycles.append(paths[v] + [start])
                    frontier = []
                    break
                if w not in paths:
                    paths[w] = paths[v] + [w]
                    frontier.append(w)
    return cycles


def _graph(paths) -> dict:
    modules = {_module_name(p) for p in paths}
    return {_module_name(p): _imports(p, modules) for p in paths}


PACKAGE_SOURCES = [p for p in SOURCES if p.relative_to(ROOT).parts[0] in PACKAGES]


def test_no_import_cycle_among_the_modules():
    """The import graph of categories/ and lenses/ (imports at module level and inside
    functions, relative ones resolved; a package imported through its `__init__`) has no
    cycle. Importing a module imports its parent packages first; that is Python's loading,
    not a dependency, and is not an edge."""
    cycles = _cycles(_graph(PACKAGE_SOURCES))
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_cycle_check_finds_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert _cycles(graph) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    # and the graph is read from the source: a module imports its sibling, lazily too
    modules = {"lenses.training.fit", "lenses.training.saved", "lenses.training.trainer",
               "lenses.optimisers", "lenses.para_lens"}
    found = _imports(ROOT / "lenses/training/fit.py", modules)
    assert {"lenses.training.saved", "lenses.training.trainer"} <= found, found


def test_no_module_of_the_packages_is_a_slab():
    """No module of categories/ or lenses/ over 500 lines."""
    long = {str(p.relative_to(ROOT)): n for p in PACKAGE_SOURCES
            if (n := len(p.read_text().splitlines())) > 500}
    assert not long, f"modules over 500 lines: {long}"


def test_no_function_of_the_packages_over_60_lines():
    """No function of categories/ or lenses/ over 60 lines (its docstring included)."""
    long = []
    for path in PACKAGE_SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > 60:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, "functions over 60 lines:\n" + "\n".join(long)


def test_every_module_the_readmes_layout_names_exists():
    """The README's layout block: each `name.py` it gives in parentheses is a module of the
    folder the line describes (or below it), and each `dir/` a folder there or at the root."""
    readme = (ROOT / "README.md").read_text()
    block = readme[readme.index("\ncategories/ "):readme.index("\ntests/ ")]
    entries = re.split(r"\n(?=\S)", block.strip())  # a folder's line and its continuations
    named = [(entry.split()[0].rstrip("/"), word) for entry in entries
             for inside in re.findall(r"\(([^()]*)\)", " ".join(entry.split()))
             for word in re.findall(r"\w+\.py|\w+/", inside)]
    assert len(named) > 15, named
    for package, word in named:
        where = [ROOT / word, ROOT / package / word, *(ROOT / package).rglob(word.rstrip("/"))]
        assert any(p.exists() for p in where), f"the README's layout names {package}/{word}"
