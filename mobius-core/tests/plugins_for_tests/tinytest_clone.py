"""A second plugin claiming ``tinytest``: a model-type conflict."""

from mobius import hookimpl
from mobius.records import ModelTypeInfo


@hookimpl
def mobius_model_types():
    return [ModelTypeInfo("tinytest"), ModelTypeInfo("clone_only")]
