"""``mobius serve``: an OpenAI-compatible HTTP server for any package (the ``[serve]`` extra).

:mod:`~mobius_runtime.serve.app` (endpoints), :mod:`~mobius_runtime.serve.schemas`
(request bodies), :mod:`~mobius_runtime.serve.errors` (OpenAI error objects),
:mod:`~mobius_runtime.serve.media` (data URLs), :mod:`~mobius_runtime.serve.cli` (the
command). Requests are decoded together by :class:`mobius_runtime.engine.Engine`.
"""
