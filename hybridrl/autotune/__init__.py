"""Choosing sizes from measurements: the micro-batch from memory (``memory_sizing``'s analytic model, ``memory_probe``,
``auto_micro_batch``), the gradient-noise scale (``grad_noise``) and the accumulation steps that follow it
(``adaptive_accumulation``) — the last two as hooks of a training engine."""
