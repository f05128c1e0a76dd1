"""A plugin with a misspelled hook name (``mobius_model_type`` lacks its ``s``)."""

from mobius import hookimpl
from mobius.records import ModelTypeInfo


@hookimpl
def mobius_model_type() -> list[ModelTypeInfo]:
    return [ModelTypeInfo("misspelled")]
