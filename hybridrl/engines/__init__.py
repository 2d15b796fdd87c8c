"""Per-rank training engines: one :class:`~hybridrl.engines.base.TrainingEngine` for every trained role.

Start reading at ``base.TrainingEngine.optimizer_step`` (the path of a mini-batch: global normaliser → micro-batches →
loss → backward with or without gradient sync → hooks → clip/step) and ``losses`` (what it backpropagates). Around
them: ``micro_batches`` (how a rank cuts its data), ``hooks`` (the plug-in points), ``passes`` (no-grad log-probs,
values, pair rewards), ``anti_forgetting`` (PPO-ptx and EWC hooks), ``optim``/``precision`` (AdamW, schedules,
8-bit states), ``checkpoint`` (DCP shards, HF export), ``offload``. No Ray here.
"""
