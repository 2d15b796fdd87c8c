"""The generic name → object registry (hybridrl.utils.registry)."""

from __future__ import annotations

import pytest

from hybridrl.utils.registry import Registry, UnknownNameError


def _filled() -> Registry:
    registry: Registry = Registry("widget")

    @registry.register("b")
    def widget_b():
        return "b"

    @registry.register("a")
    def widget_a():
        return "a"

    return registry


def test_register_returns_the_object_and_looks_it_up():
    registry = _filled()
    assert registry["a"]() == "a" and registry["b"]() == "b"
    assert registry.names() == ("b", "a")  # registration order, for stable help texts
    assert list(registry) == ["b", "a"] and len(registry) == 2
    assert "a" in registry and "zzz" not in registry
    assert registry.get("zzz") is None and registry.get("a") is registry["a"]


def test_unknown_name_is_a_value_error_listing_valid_names():
    registry = _filled()
    with pytest.raises(ValueError) as excinfo:
        registry["zzz"]
    message = str(excinfo.value)
    assert "widget" in message and "'zzz'" in message and "b, a" in message
    with pytest.raises(KeyError):  # and still a KeyError, for Mapping idioms
        registry["zzz"]
    assert isinstance(excinfo.value, UnknownNameError)


def test_duplicate_registration_is_refused_unless_overridden():
    registry = _filled()
    with pytest.raises(ValueError, match="already registered"):
        registry.register("a")(lambda: "other")
    same = registry["a"]
    assert registry.register("a")(same) is same  # re-registering the same object is harmless
    registry.register("a", override=True)(lambda: "new")
    assert registry["a"]() == "new"


@pytest.mark.parametrize("bad", ["", None, 3])
def test_names_must_be_non_empty_strings(bad):
    with pytest.raises(ValueError):
        Registry("widget").register(bad)


def test_a_module_run_again_replaces_its_own_definitions_and_only_those():
    """An edited plugin file is run again under the same module name: its new class replaces the old one. Another
    module's object under the name, or a function-local one, is still refused."""
    import types

    registry: Registry = Registry("widget")
    first, second, other = (types.ModuleType(name) for name in ("hybridrl_user_plugin", "hybridrl_user_plugin",
                                                                  "hybridrl_user_another"))
    for module, version in ((first, 1), (second, 2), (other, 3)):
        exec(f"class Widget:\n    VERSION = {version}\n", module.__dict__)  # its __module__: the module's name
    registry.register("w")(first.Widget)
    assert registry.register("w")(second.Widget) is second.Widget and registry["w"].VERSION == 2
    with pytest.raises(ValueError, match="already registered"):
        registry.register("w")(other.Widget)

    def make(value):
        def widget():
            return value
        return widget

    registry.register("f")(make(1))
    with pytest.raises(ValueError, match="already registered"):  # the same qualname, but local to a function
        registry.register("f")(make(2))
