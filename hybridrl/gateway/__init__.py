"""An OpenAI-compatible gateway over a rollout replica, with exact token capture per session (docs/concepts.md,
"The gateway")."""
