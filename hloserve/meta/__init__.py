"""Meta models: a bundle's Python ``run(inputs, call)`` chaining other models (docs/meta_models.md).

The typed core behind the ``hloserve_meta`` Triton backend; nothing here imports Triton.
Modules: core (load ``run``, :class:`~hloserve.meta.core.MetaModel`,
:class:`~hloserve.meta.core.MetaCall`), channel_calls (sub-calls over the runtime's channel),
gate (at most N meta runs per server), deadline.
"""
