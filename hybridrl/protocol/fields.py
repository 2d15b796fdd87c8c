"""Canonical field names of a :class:`~hybridrl.protocol.Batch` and typed accessors for them.

Shape letters used throughout:

- ``B`` — batch size (sequences; after ``rollout.n`` expansion, prompts × responses per prompt),
- ``T`` — full sequence length (prompt + response), ``T = P + R``,
- ``P`` — prompt length (left-padded), ``R`` — response length (right-padded).

Every per-token quantity of the RL step lives on the response positions only (``[B, R]``); ``response_mask`` marks
the real (non-padding) response tokens with 1.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor


class Fields:
    """String constants for the field names the framework relies on, so no stage types a key twice.

    Use them for both writing and reading: ``batch[Fields.ADVANTAGES] = adv`` and ``batch.advantages``.
    """

    # Sequence layout, [B, T] / [B, P] / [B, R].
    INPUT_IDS = "input_ids"
    ATTENTION_MASK = "attention_mask"
    POSITION_IDS = "position_ids"
    PROMPTS = "prompts"
    RESPONSES = "responses"
    RESPONSE_MASK = "response_mask"
    # Per-response-token quantities, [B, R].
    OLD_LOG_PROBS = "old_log_probs"
    REF_LOG_PROBS = "ref_log_probs"
    TEACHER_LOG_PROBS = "teacher_log_probs"  # on-policy distillation: the teacher's log-probs of the sampled tokens
    ROLLOUT_LOG_PROBS = "rollout_log_probs"
    # [B, T, routers, k] int16: the experts an MoE rollout routed each token to (-1: none), aligned with input_ids
    ROUTED_EXPERTS = "routed_experts"
    VALUES = "values"
    TOKEN_LEVEL_SCORES = "token_level_scores"
    SCORES = "scores"  # [B]: the reward function's score of each response, before reward shaping
    TOKEN_LEVEL_REWARDS = "token_level_rewards"
    ADVANTAGES = "advantages"
    RETURNS = "returns"
    ENTROPY = "entropy"
    IS_WEIGHTS = "is_weights"  # [B, R]: off-policy importance weights the policy loss multiplies in
    # [B] int64: the policy_version that generated each row — the trainer's count of training steps done when the
    # weights were taken (docs/concepts.md, "One policy version")
    POLICY_VERSION = "policy_version"
    # [B, R] int64: the policy_version of each token (partial rollout: a row may span updates); -1 past the end
    TOKEN_POLICY_VERSIONS = "token_policy_versions"
    # Non-tensor, one per sample: the id of the prompt a response came from (groups responses for GRPO / RLOO).
    UID = "uid"
    # Non-tensor, one per sample: a row's image inputs, {"pixel_values": [patches, D], "image_grid_thw": [images, 3]}
    # (None: no image), verl's name (hybridrl.modeling.multimodal)
    MULTI_MODAL_INPUTS = "multi_modal_inputs"


class TypedFieldsMixin:
    """Read-only typed properties for the canonical tensor fields of :class:`Fields`.

    Each property returns the stored tensor itself (no copy) or raises ``KeyError`` naming the missing field and the
    fields that are present. To write, use ``batch[Fields.X] = tensor`` (validated against the batch size).
    """

    def _typed_tensor(self, name: str) -> Tensor:  # implemented by Batch
        raise NotImplementedError

    @property
    def input_ids(self) -> Tensor:
        """Token ids of prompt + response, ``[B, T]`` int64 (prompt left-padded, response right-padded)."""
        return self._typed_tensor(Fields.INPUT_IDS)

    @property
    def attention_mask(self) -> Tensor:
        """1 for real tokens, 0 for padding, ``[B, T]`` (int64 or bool)."""
        return self._typed_tensor(Fields.ATTENTION_MASK)

    @property
    def position_ids(self) -> Tensor:
        """Position of each token counted over real tokens only, ``[B, T]`` int64."""
        return self._typed_tensor(Fields.POSITION_IDS)

    @property
    def prompts(self) -> Tensor:
        """Prompt token ids, left-padded, ``[B, P]`` int64."""
        return self._typed_tensor(Fields.PROMPTS)

    @property
    def responses(self) -> Tensor:
        """Generated token ids, right-padded, ``[B, R]`` int64."""
        return self._typed_tensor(Fields.RESPONSES)

    @property
    def response_mask(self) -> Tensor:
        """1 on real response tokens, 0 on padding, ``[B, R]``; the mask every token-level loss reduces over."""
        return self._typed_tensor(Fields.RESPONSE_MASK)

    @property
    def old_log_probs(self) -> Tensor:
        """Log-probs (nats) of the response tokens under the policy before this update, ``[B, R]`` float."""
        return self._typed_tensor(Fields.OLD_LOG_PROBS)

    @property
    def ref_log_probs(self) -> Tensor:
        """Log-probs (nats) of the response tokens under the frozen reference policy, ``[B, R]`` float."""
        return self._typed_tensor(Fields.REF_LOG_PROBS)

    @property
    def teacher_log_probs(self) -> Tensor:
        """Log-probs (nats) of the response tokens under an on-policy distillation teacher, ``[B, R]`` float."""
        return self._typed_tensor(Fields.TEACHER_LOG_PROBS)

    @property
    def rollout_log_probs(self) -> Tensor:
        """Log-probs (nats) reported by the rollout engine while sampling, ``[B, R]`` float."""
        return self._typed_tensor(Fields.ROLLOUT_LOG_PROBS)

    @property
    def routed_experts(self) -> Tensor:
        """The experts an MoE rollout routed each token to, ``[B, T, routers, k]`` int16 (-1: not recorded)."""
        return self._typed_tensor(Fields.ROUTED_EXPERTS)

    @property
    def values(self) -> Tensor:
        """Critic value estimates per response token, ``[B, R]`` float."""
        return self._typed_tensor(Fields.VALUES)

    @property
    def token_level_scores(self) -> Tensor:
        """Raw reward-function / reward-model scores placed on response tokens (before KL), ``[B, R]`` float."""
        return self._typed_tensor(Fields.TOKEN_LEVEL_SCORES)

    @property
    def scores(self) -> Tensor:
        """The reward function's score of each response before reward shaping, ``[B]`` float."""
        return self._typed_tensor(Fields.SCORES)

    @property
    def token_level_rewards(self) -> Tensor:
        """Rewards fed to the advantage estimator (scores, minus the KL penalty if it is in the reward), ``[B, R]``."""
        return self._typed_tensor(Fields.TOKEN_LEVEL_REWARDS)

    @property
    def advantages(self) -> Tensor:
        """Advantage estimates per response token, ``[B, R]`` float."""
        return self._typed_tensor(Fields.ADVANTAGES)

    @property
    def returns(self) -> Tensor:
        """Value targets (advantages + values for GAE), ``[B, R]`` float."""
        return self._typed_tensor(Fields.RETURNS)

    @property
    def entropy(self) -> Tensor:
        """Policy entropy (nats) at each response position, ``[B, R]`` float — logged, and the entropy bonus."""
        return self._typed_tensor(Fields.ENTROPY)

    @property
    def is_weights(self) -> Tensor:
        """Off-policy importance weights (``algorithm.off_policy_correction``), ``[B, R]`` float, 0 past the end."""
        return self._typed_tensor(Fields.IS_WEIGHTS)

    @property
    def policy_version(self) -> Tensor:
        """The ``policy_version`` that generated each row, ``[B]`` int64 (staleness = step trained − this)."""
        return self._typed_tensor(Fields.POLICY_VERSION)

    @property
    def token_policy_versions(self) -> Tensor:
        """The ``policy_version`` that generated each token, ``[B, R]`` int64, -1 past the end (partial
        rollout: a row's tokens may come from several versions; its staleness is its oldest token's)."""
        return self._typed_tensor(Fields.TOKEN_POLICY_VERSIONS)
