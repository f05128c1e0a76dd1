"""Every hook of the plugin API says when it is called, who answers and what it returns."""

from __future__ import annotations

import inspect

import pytest

from mobius import hookspecs

HOOKS = sorted(
    name
    for name, obj in vars(hookspecs).items()
    if name.startswith("mobius_") and inspect.isfunction(obj)
)


def test_the_api_has_hooks() -> None:
    assert "mobius_model_types" in HOOKS
    assert len(HOOKS) >= 9


@pytest.mark.parametrize("name", HOOKS)
def test_hook_is_a_spec(name: str) -> None:
    assert hasattr(getattr(hookspecs, name), f"{hookspecs.PROJECT}_spec"), (
        f"{name} is not decorated with @hookspec"
    )


@pytest.mark.parametrize("name", HOOKS)
def test_hook_docstring_names_when_and_who(name: str) -> None:
    doc = inspect.getdoc(getattr(hookspecs, name)) or ""
    missing = [part for part in ("Called:", "Who answers:", "Returns:") if part not in doc]
    assert not missing, f"hook {name} docstring lacks {missing}"
    summary = doc.splitlines()[0] if doc else ""
    assert len(summary) > 10, f"hook {name} needs a one-line summary"


def test_every_spec_is_reachable_through_the_plugin_manager() -> None:
    import pluggy

    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    for name in HOOKS:
        assert getattr(pm.hook, name).has_spec()
