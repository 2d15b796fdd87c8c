"""Models and how they run on a rank: building them (``model_builder``), sharding (``fsdp``; ``single_rank`` when one
rank keeps its parameters gathered), attention kernels (``attention``), LoRA (``lora``), fp8 compute (``fp8``), and
forwards over prompt + response rows — padded, packed or with shared prompts, same numbers (``sequences``,
``shared_prompts``, ``positions``). Below the rollout engines and the training engines, which both use it."""
