"""An encoder reward model (DeBERTa-v2/v3: no ``_no_split_modules``, no per-token ``score`` head, pools its first
token): its transformer blocks are found for FSDP2, and a left-padded batch scores each row as that row alone."""

from __future__ import annotations

import torch
from transformers import AutoModelForSequenceClassification, DebertaV2Config

from hybridrl.modeling.model_builder import decoder_layers
from hybridrl.modeling.sequences import sequence_scores


def tiny_deberta():
    torch.manual_seed(0)
    config = DebertaV2Config(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                             intermediate_size=64, max_position_embeddings=64, num_labels=1, pad_token_id=0,
                             relative_attention=True, position_buckets=16, pos_att_type=["p2c", "c2p"],
                             norm_rel_ebd="layer_norm", share_att_key=True)
    return AutoModelForSequenceClassification.from_config(config).eval()


def test_the_blocks_of_an_encoder_without_no_split_modules_are_its_layer_stack():
    model = tiny_deberta()
    assert not getattr(model, "_no_split_modules", None)
    assert decoder_layers(model) == list(model.deberta.encoder.layer)


def test_a_left_padded_batch_scores_each_row_as_alone():
    model = tiny_deberta()
    rows = [[5, 6, 7, 8, 9], [11, 12, 13]]
    width = max(map(len, rows))
    ids = torch.tensor([[0] * (width - len(row)) + row for row in rows])
    mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in rows])
    with torch.no_grad():
        batched = sequence_scores(model, ids, mask)
        alone = [model(input_ids=torch.tensor([row])).logits.squeeze() for row in rows]
    assert torch.allclose(batched, torch.stack(alone), atol=1e-5)
