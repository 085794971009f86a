"""One way to do each thing: the public names of `categories` and `lenses` each mean one thing.

No name is public in both packages with two meanings, no two public names are bound to one
object (an alias is a second way to say the same thing), and the error catalogue is listed
once, in `categories`, and re-exported by `lenses` as the same classes.
"""

from collections import defaultdict

import categories
import categories.errors
import lenses

PACKAGES = (categories, lenses)

#: Names that left the public API when each thing got one way to be done (the library is at
#: 0.1: no shims). `gd(lr, metric)` is the update map; `sharp` is the sharp part;
#: `categories.flatten_value`/`unflatten_value` flatten a point; the smooth-map identity and
#: discard are `categories.smooth_identity`/`smooth_discard`, Para's tying `para_tie`, and the
#: identity of a tangent space `linear_identity` (as `smooth_`, `para_`, `lens_identity`).
REMOVED = {lenses: {"update", "Update", "sharp_transform", "ravel", "unflatten_like"},
           categories: {"identity", "discard", "tie", "identity_linear"}}


def _public():
    return [(package.__name__, name, getattr(package, name))
            for package in PACKAGES for name in package.__all__]


def test_the_all_lists_have_no_repeats_and_name_real_attributes():
    for package in PACKAGES:
        assert len(package.__all__) == len(set(package.__all__)), package.__name__
        missing = [n for n in package.__all__ if not hasattr(package, n)]
        assert not missing, f"{package.__name__}.__all__ lists names it lacks: {missing}"


def test_no_name_means_two_things_across_the_packages():
    both = set(categories.__all__) & set(lenses.__all__)
    different = sorted(n for n in both if getattr(categories, n) is not getattr(lenses, n))
    assert not different, f"public in both packages with different meanings: {different}"
    # and a name public in one package is not another object under that name in the other
    for here, there in ((categories, lenses), (lenses, categories)):
        clash = sorted(n for n in here.__all__
                       if hasattr(there, n) and getattr(there, n) is not getattr(here, n)
                       and not n.startswith("_") and not _is_module(getattr(there, n)))
        assert not clash, f"{here.__name__} names that mean something else in {there.__name__}: {clash}"


def _is_module(x):
    return type(x).__name__ == "module"


def test_no_two_public_names_are_bound_to_one_object():
    names = defaultdict(set)
    for package, name, obj in _public():
        if isinstance(obj, (int, float, str, tuple)) and not callable(obj):
            continue  # constants (KEY_SHAPE, CATALOGUE) may equal others by value
        names[id(obj)].add(f"{package}.{name}")
    aliases = sorted(sorted(v) for v in names.values() if len(v) > 1)
    assert not aliases, f"two public names for one object: {aliases}"


def test_each_error_is_listed_once_and_lenses_re_exports_the_same_class():
    for cls in categories.errors.CATALOGUE:
        assert cls.__name__ in categories.__all__ and cls.__name__ not in lenses.__all__
        assert getattr(lenses, cls.__name__) is cls is getattr(categories, cls.__name__)
    assert "CATALOGUE" in categories.__all__ and "CATALOGUE" not in lenses.__all__


def test_removed_names_stay_removed():
    for package, names in REMOVED.items():
        back = sorted(n for n in names if n in package.__all__ or hasattr(package, n))
        assert not back, f"{package.__name__} has again: {back}"
