"""The Ray roles, one process per device: the hybrid-engine actor + rollout + reference (``actor_worker``), the critic,
the reward model and reward-model training. Each owns per-rank engines (:mod:`hybridrl.engines`) and declares the
dispatch of every method next to it (:mod:`hybridrl.runtime`)."""
