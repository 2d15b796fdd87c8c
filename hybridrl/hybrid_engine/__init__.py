"""Hybrid engine: reshard FSDP2 training weights into the rollout (tensor-parallel) layout, streamed in buckets.

- ``plan``: the resharding plan as data (who sends which box of which parameter to whom), pure Python;
- ``tp_rules``: per-parameter tensor-parallel slicing (Megatron/vLLM column / row / vocab / replicated, GQA);
- ``volume``: per-rank bytes from the plan, the exact interval identity and the closed-form formula;
- ``buckets``: packing parameters into buckets of bounded per-rank memory;
- ``transfer``: executing a plan over a process group (point-to-point, or all-gather for t_g = 1) as a stream;
- ``checksums``: per-parameter fingerprints on both sides of a sync, compared (the checked weight transfer);
- ``names``: HF → engine names (identity, or vLLM's fused ``qkv_proj`` / ``gate_up_proj``);
- ``sync``: ``WeightResharder``, what a colocated worker calls.
"""

from hybridrl.hybrid_engine.buckets import Bucket, bucket_bound, bucket_bytes_from_mb, pack_buckets
from hybridrl.hybrid_engine.checksums import SyncChecksums, WeightSyncMismatch, region_fingerprint
from hybridrl.hybrid_engine.names import EngineName, engine_name_map, fused_name, identity_name, rename
from hybridrl.hybrid_engine.plan import GenerationLayout, ParamMeta, ReshardPlan, Transfer, build_plan
from hybridrl.hybrid_engine.sync import WeightResharder
from hybridrl.hybrid_engine.tp_rules import SplitRule, decoder_rules, rules_for_config
from hybridrl.hybrid_engine.transfer import TransferStats, stream_gathered, stream_plan
from hybridrl.hybrid_engine.volume import RankTraffic, closed_form_traffic, interval_traffic, plan_traffic

__all__ = [
    "Bucket", "EngineName", "GenerationLayout", "ParamMeta", "RankTraffic", "ReshardPlan", "SplitRule",
    "SyncChecksums", "Transfer", "TransferStats", "WeightResharder", "WeightSyncMismatch", "bucket_bound",
    "bucket_bytes_from_mb", "build_plan", "closed_form_traffic", "decoder_rules", "engine_name_map", "fused_name",
    "identity_name", "interval_traffic", "pack_buckets", "plan_traffic", "region_fingerprint", "rename",
    "rules_for_config", "stream_gathered", "stream_plan",
]
