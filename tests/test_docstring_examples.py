"""Every public function and class of `categories` and `lenses` shows a short example in its
docstring, and every example runs (doctest, over every module of the two packages).

The examples are written as a reader of the API reference types them after
`import jax, jax.numpy as jnp, numpy as np` and `from categories import *; from lenses import *`
(the two namespaces share no name with two meanings, tests/test_namespaces.py), so those are
the globals they run with; floats are printed rounded, or compared with `np.allclose`.
"""

import doctest
import importlib
import inspect
import pkgutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import categories
import lenses

#: Names whose docstring examples the lead adds with the training engine's rewrite: they are
#: defined in lenses/learner.py, lenses/fitting.py, lenses/saved.py and
#: lenses/optimisers/lens.py (`chain` too). Empty it as they gain examples.
LEAD_ADDS_EXAMPLES: set = set()


def _modules():
    for package in (categories, lenses):
        yield package
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            yield importlib.import_module(info.name)


def _globals():
    env = {"jax": jax, "jnp": jnp, "np": np}
    env.update({name: getattr(categories, name) for name in categories.__all__})
    env.update({name: getattr(lenses, name) for name in lenses.__all__})
    return env


def _public():
    for package in (categories, lenses):
        for name in package.__all__:
            obj = getattr(package, name)
            # functions and classes; values such as `tanh` (a LensFamily) or `KEY_SHAPE` are
            # documented by their class or in the reference
            if inspect.isclass(obj) or inspect.isroutine(obj):
                yield f"{package.__name__}.{name}", name, obj


def test_every_public_function_and_class_has_an_example():
    missing = sorted({full for full, name, obj in _public()
                      if ">>>" not in (inspect.getdoc(obj) or "") and name not in LEAD_ADDS_EXAMPLES})
    assert not missing, f"public names without a docstring example: {missing}"


def test_the_lead_set_names_only_public_names_without_examples():
    # an entry that gained an example (or left the API) is taken out of the set
    public = {name: obj for _, name, obj in _public()}
    stale = sorted(n for n in LEAD_ADDS_EXAMPLES if n not in public or ">>>" in (inspect.getdoc(public[n]) or ""))
    assert not stale, f"remove from LEAD_ADDS_EXAMPLES: {stale}"


@pytest.mark.parametrize("module", [m.__name__ for m in _modules()])
def test_docstring_examples_run(module):
    mod = importlib.import_module(module)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    failures = []
    for t in finder.find(mod, module, globs=_globals()):
        if t.examples and t.name.startswith(module):  # only what the module defines
            runner.run(t, out=failures.append)
    assert runner.failures == 0, "".join(failures)
