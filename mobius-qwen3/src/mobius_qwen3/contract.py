"""The pipeline contract of a Qwen3 package: core's one-``model`` decoder LM contract."""

from __future__ import annotations

from mobius.contract import Contract
from mobius.lm.decoder import decoder_shape
from mobius.lm.ports import lm_contract
from mobius.records import BuildOptions
from mobius_qwen3.config import Qwen3Config


def pipeline_contract(config: Qwen3Config, options: BuildOptions) -> Contract:
    return lm_contract(decoder_shape(config), options.port_dtype)
