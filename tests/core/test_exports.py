"""A stage's public API, loaded on first use: names from the package's own modules, refused twice, unknown names
refused as Python refuses them."""

import sys

import pytest

import oomlab.core
from oomlab.core import units
from oomlab.core.exports import lazy_exports


def test_names_come_sorted_and_load_on_first_use() -> None:
    """``__all__`` is sorted; the first access imports the module and keeps the value on the package."""
    names, getattr_, dir_ = lazy_exports("oomlab.core", {"units": ("parse_size", "GiB"), "words": ("plural",)})
    assert names == ["GiB", "parse_size", "plural"]
    assert getattr_("parse_size") is units.parse_size
    assert vars(sys.modules["oomlab.core"])["parse_size"] is units.parse_size
    assert {"GiB", "parse_size", "plural", "__doc__"} <= set(dir_())


def test_an_unknown_name_is_an_attribute_error() -> None:
    """An unexported name raises AttributeError (so ``from oomlab.core import units`` still finds the module)."""
    _, getattr_, _ = lazy_exports("oomlab.core", {"units": ("GiB",)})
    with pytest.raises(AttributeError, match="^module 'oomlab.core' has no attribute 'MiB'$"):
        getattr_("MiB")
    with pytest.raises(AttributeError, match="^module 'oomlab.core' has no attribute 'nothing_here'$"):
        _ = oomlab.core.nothing_here


def test_a_name_exported_twice_is_refused() -> None:
    """One name, one module: a second source is refused, naming both."""
    with pytest.raises(ValueError, match=r"^oomlab.core exports 'GiB' twice: from oomlab.core.units and "
                                         r"oomlab.core.words$"):
        lazy_exports("oomlab.core", {"units": ("GiB",), "words": ("GiB",)})


def test_the_stage_exports_its_main_names() -> None:
    """``oomlab.core``'s names are the defining modules' objects."""
    from oomlab.core.setup import TrainingSetup, make_setup

    assert oomlab.core.make_setup is make_setup and oomlab.core.TrainingSetup is TrainingSetup
    assert "make_setup" in oomlab.core.__all__ and "make_setup" in dir(oomlab.core)
