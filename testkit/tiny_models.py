"""Tiny random models for the server's non-embedding tasks, built offline from configs.

Each ``build_*`` function is pure apart from writing one directory: it builds a model with random weights
(hidden sizes ~32, two layers) and ``save_pretrained``s it, together with its tokenizer / processor, into
``out``, exactly as a real model folder is laid out.  The task modules then load these folders through
their real loading code.  Nothing is downloaded: the tokenizer is trained on a handful of sentences.

CLI (for the demo and the benchmarks)::

    python -m testkit.tiny_models --task vision --out /tmp/tiny-vision
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

# The sentences the tiny BPE tokenizer is trained on.  Characters outside it map to the unknown token.
_CORPUS = [
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "A man is eating food. A man is eating bread. A man is riding a horse.",
    "Once upon a time there was a tiny model that served requests behind a bounded queue.",
    "What is in this picture? A red square on a blue background.",
    "system\nuser\nassistant: answer briefly and politely; numbers 0123456789 (ok?)",
]

# A ChatML-style template: enough to prove the task renders chat messages with the tokenizer's template.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

EOS = "<|endoftext|>"
UNK = "<unk>"
SPECIAL_TOKENS = [EOS, "<pad>", UNK, "<|im_start|>", "<|im_end|>"]
IMAGE_SIZE = 32
HIDDEN = 32


def build_tokenizer(model_max_length: int = 128, chat_template: str | None = CHAT_TEMPLATE) -> Any:
    """A BPE ``PreTrainedTokenizerFast`` trained on ``_CORPUS`` (a few hundred tokens)."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tf: Any = transformers  # the constructors are not statically typed

    # Metaspace BPE over the corpus' characters (not byte-level): every token decodes to whole characters,
    # so the random model's output is readable text, never half of a UTF-8 sequence.
    tok = Tokenizer(models.BPE(unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=SPECIAL_TOKENS)
    tok.train_from_iterator(_CORPUS, trainer=trainer)
    fast = tf.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=EOS,
        eos_token=EOS,
        unk_token=UNK,
        pad_token="<pad>",
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )
    if chat_template is not None:
        fast.chat_template = chat_template
    return fast


def build_text_generation(out: Path) -> Path:
    """A 2-layer GPT-2 (hidden 32, context 128) and its tokenizer with a chat template."""
    from transformers import GPT2LMHeadModel

    tokenizer = build_tokenizer()
    return _save_causal_lm(out, GPT2LMHeadModel, _gpt2_config(tokenizer), tokenizer)


def build_llama_generation(out: Path, context: int = 128) -> Path:
    """A 2-layer Llama (hidden 32, grouped-query attention, ``context`` positions, 128 unless a test needs
    generations that last): the shape continuous batching serves, with the tokenizer and chat template of
    ``build_text_generation``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = build_tokenizer(model_max_length=context)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        **_tower(num_key_value_heads=1),
        max_position_embeddings=context,
        **_special_tokens(tokenizer),
    )
    return _save_causal_lm(out, LlamaForCausalLM, config, tokenizer)


def build_lora_adapter(base: Path, out: Path, seed: int) -> Path:
    """A random LoRA adapter (peft, rank 4) of the causal LM saved in ``base``, saved in ``out`` as a
    PeftModel saves one: weights drawn from ``seed`` and large enough that its greedy tokens differ from the
    base model's and from another seed's."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "gate_proj", "down_proj"])
    peft_model: Any = get_peft_model(model, config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, weight in peft_model.named_parameters():
            if "lora_" in name:  # peft starts B at zero (no change); a random B makes the adapter matter
                weight.copy_(torch.randn(weight.shape, generator=generator))
    peft_model.save_pretrained(out)
    return out


def _gpt2_config(tokenizer: Any, **extra: Any) -> Any:
    """A 2-layer GPT-2 of hidden 32 and context 128 for ``tokenizer``, with the fields ``extra`` adds."""
    from transformers import GPT2Config

    return GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=128,
        n_embd=HIDDEN,
        n_layer=2,
        n_head=2,
        **_special_tokens(tokenizer),
        **extra,
    )


def _tower(**extra: Any) -> dict[str, Any]:
    """A transformer tower of the tiny size every model here has (2 layers, 2 heads, hidden 32), with the
    fields ``extra`` adds."""
    return {
        "hidden_size": HIDDEN,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        **extra,
    }


def _special_tokens(tokenizer: Any) -> dict[str, Any]:
    """A generation model's special tokens: the end of text begins and pads a sequence too."""
    return {
        "bos_token_id": tokenizer.eos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }


def _save_causal_lm(out: Path, model_class: Any, config: Any, tokenizer: Any) -> Path:
    """The model of ``config`` with seeded (reproducible) random weights, saved with its tokenizer."""
    import torch

    torch.manual_seed(0)
    model: Any = model_class(config)
    model.eval()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def build_image_embedding(out: Path, projection_dim: int = 16) -> Path:
    """A tiny CLIP (text and vision towers of 2 layers, hidden 32, 32x32 images) + CLIPImageProcessor."""
    import torch
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel

    torch.manual_seed(0)
    config = CLIPConfig(
        text_config=_tower(
            vocab_size=320, max_position_embeddings=32, bos_token_id=0, eos_token_id=0, pad_token_id=1
        ),
        vision_config=_tower(image_size=IMAGE_SIZE, patch_size=8),
        projection_dim=projection_dim,
    )
    clip: Any = CLIPModel(config)
    clip.eval().save_pretrained(out)
    size = {"shortest_edge": IMAGE_SIZE}
    crop = {"height": IMAGE_SIZE, "width": IMAGE_SIZE}
    CLIPImageProcessor(size=size, crop_size=crop).save_pretrained(out)
    return out


def build_vision(out: Path) -> Path:
    """A tiny VisionEncoderDecoder: ViT encoder (32x32 images) + GPT-2 decoder with cross-attention."""
    import torch
    from transformers import (
        VisionEncoderDecoderConfig,
        VisionEncoderDecoderModel,
        ViTConfig,
        ViTImageProcessor,
    )

    tokenizer = build_tokenizer(chat_template=None)
    torch.manual_seed(0)
    encoder = ViTConfig(**_tower(image_size=IMAGE_SIZE, patch_size=8))
    decoder = _gpt2_config(tokenizer, add_cross_attention=True)
    config = VisionEncoderDecoderConfig.from_encoder_decoder_configs(encoder, decoder)
    config.decoder_start_token_id = tokenizer.eos_token_id
    config.pad_token_id = tokenizer.pad_token_id
    config.eos_token_id = tokenizer.eos_token_id
    model: Any = VisionEncoderDecoderModel(config=config)
    model.eval()
    with torch.no_grad():
        # Zero the end-of-text logit: a random decoder otherwise often ends a caption at its first token,
        # leaving the tests no text to check.  (The tied input embedding of the start token becomes zero.)
        model.decoder.lm_head.weight[tokenizer.eos_token_id] = 0.0
    model.generation_config.decoder_start_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    ViTImageProcessor(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}).save_pretrained(out)
    return out


def build_vision_blip(out: Path) -> Path:
    """A tiny BLIP captioner (``AutoModelForImageTextToText`` + ``BlipProcessor``): the vision task's
    image-text-to-text path, as opposed to the encoder-decoder one."""
    import torch
    import transformers

    tf: Any = transformers  # the constructors are not statically typed
    tokenizer = build_tokenizer(chat_template=None)
    torch.manual_seed(0)
    config = tf.BlipConfig(
        text_config=_tower(
            vocab_size=len(tokenizer),
            encoder_hidden_size=HIDDEN,
            max_position_embeddings=64,
            sep_token_id=tokenizer.eos_token_id,
            **_special_tokens(tokenizer),
        ),
        vision_config=_tower(image_size=IMAGE_SIZE, patch_size=8),
        projection_dim=16,
        image_text_hidden_size=HIDDEN,
    )
    model = tf.BlipForConditionalGeneration(config)
    with torch.no_grad():  # as for the encoder-decoder: no end-of-text at the first step
        model.text_decoder.cls.predictions.decoder.weight[tokenizer.eos_token_id] = 0.0
        model.text_decoder.cls.predictions.bias[tokenizer.eos_token_id] = -1.0
    model.eval().save_pretrained(out)
    image_processor = tf.BlipImageProcessor(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    tf.BlipProcessor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(out)
    return out


def build_text_to_image(out: Path) -> Path:
    """A tiny Stable Diffusion pipeline (UNet, VAE and CLIP text encoder of hidden 32, DDIM scheduler),
    shaped like diffusers' own ``get_dummy_components`` test fixtures."""
    import diffusers
    import torch

    dm: Any = diffusers  # the constructors are not statically typed
    from transformers import CLIPTextConfig, CLIPTextModel

    tokenizer = build_tokenizer(model_max_length=16, chat_template=None)
    torch.manual_seed(0)
    unet = dm.UNet2DConditionModel(
        block_out_channels=(4, 8),
        layers_per_block=1,
        sample_size=IMAGE_SIZE // 2,
        in_channels=4,
        out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=HIDDEN,
        norm_num_groups=2,
        attention_head_dim=2,
    )
    vae = dm.AutoencoderKL(
        block_out_channels=[4, 8],
        in_channels=3,
        out_channels=3,
        down_block_types=["DownEncoderBlock2D", "DownEncoderBlock2D"],
        up_block_types=["UpDecoderBlock2D", "UpDecoderBlock2D"],
        latent_channels=4,
        norm_num_groups=2,
        sample_size=IMAGE_SIZE,
    )
    text_encoder = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=len(tokenizer),
            **_tower(),
            max_position_embeddings=tokenizer.model_max_length,
            bos_token_id=tokenizer.eos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    )
    scheduler = dm.DDIMScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        clip_sample=False,
        set_alpha_to_one=False,
        steps_offset=1,
    )
    pipe = dm.StableDiffusionPipeline(
        unet=unet,
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipe.save_pretrained(out, safe_serialization=True)
    return out


BUILDERS: dict[str, Callable[[Path], Path]] = {
    "text-generation": build_text_generation,
    "image-embedding": build_image_embedding,
    "vision": build_vision,
    "vision-blip": build_vision_blip,  # the vision task, image-text-to-text flavour
    "text-to-image": build_text_to_image,
    "text-generation-llama": build_llama_generation,  # the text-generation task, a Llama-shaped model
}


def build(task: str, out: Path) -> Path:
    """Build the tiny model for ``task`` into ``out`` (created if missing)."""
    if task not in BUILDERS:
        raise ValueError(f"no tiny model for task {task!r}; choose one of {', '.join(sorted(BUILDERS))}")
    out.mkdir(parents=True, exist_ok=True)
    return BUILDERS[task](out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", required=True, choices=sorted(BUILDERS))
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    print(build(args.task, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
