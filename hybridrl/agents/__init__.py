"""Multi-turn agents: environments, tools and the token-in/token-out agent loop.

- ``tools``: tools from plain Python functions (schema from signature and docstring), tool-call parsing;
- ``builtin_tools``: the calculator and the sandboxed Python executor;
- ``environment``: the environment interface (reset / step / close), the tool environment, the registry;
- ``trajectory``: a multi-turn episode as token ids — the model's sampled ids exactly as generated, observation ids
  rendered with the chat template (prefix-checked), the response mask;
- ``loop``: many episodes in flight on a request engine, tools run off the engine's thread;
- ``batch`` / ``conversation``: trajectories and multi-turn demonstrations as rollout-layout rows.
"""
