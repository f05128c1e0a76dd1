"""HF transformers reference side of the Gemma 4 parity tests (L3).

Everything here imports torch and transformers lazily, inside functions, so that
collecting the test suite without the ``[reference]`` extra still works; the tests
that call in are marked ``reference`` and skip via ``pytest.importorskip``. No
source module of mobius may import this package.
"""
