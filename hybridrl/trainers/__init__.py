"""The trainers the controller runs: RL (``rl_trainer``: the PPO/GRPO dataflow, its steps between worker calls in
``rl_steps``, variants, continual learning, reward fusion, validation, health, faults, restarts), SFT and reward-model
training, and what they all share (``scaffold``: Ray and pools, tracking, resume; ``checkpoints``; ``export``)."""
