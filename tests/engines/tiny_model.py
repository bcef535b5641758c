"""A tiny local model directory that real engines can serve without a model hub.

There is no hub to download from, so the tests write the few files an engine reads: a
Llama ``config.json`` small enough to run on a CPU with random ("dummy") weights, and a
word-level ``tokenizer.json`` written as plain JSON (the ``tokenizers`` file format), so that
neither this module nor the test process needs the ``tokenizers`` package.

The vocabulary is fixed words plus ``w0``..``wN``; a prompt made of those words tokenizes
one token per word, and whatever the random weights generate decodes to such words.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")
WORDS = (
    "the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "a", "an", "and", "or",
    "to", "of", "in", "on", "at", "is", "was", "be", "hello", "world", "tell", "me", "story",
    "about", "drain", "shutdown", "engine", "request", "token", "stream",
)
VOCAB_SIZE = 512
"""Tokens in the vocabulary; also the model's ``vocab_size`` so every id decodes."""

HIDDEN_SIZE = 64
NUM_HEADS = 2
"""``HIDDEN_SIZE / NUM_HEADS`` = 32: vLLM's CPU attention backend needs ``head_dim`` >= 32."""


def vocabulary() -> dict[str, int]:
    """Token → id, special tokens first, then the fixed words, then ``w<i>`` fillers."""
    tokens = [*SPECIAL_TOKENS, *WORDS]
    tokens += [f"w{i}" for i in range(VOCAB_SIZE - len(tokens))]
    return {tok: i for i, tok in enumerate(tokens)}


def tokenizer_json() -> dict[str, Any]:
    """A word-level tokenizer in the ``tokenizers`` serialisation format."""
    vocab = vocabulary()
    added = [
        {
            "id": vocab[tok],
            "content": tok,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for tok in SPECIAL_TOKENS
    ]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "Lowercase"},
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None,
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": False},
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"},
    }


def llama_config() -> dict[str, Any]:
    """One layer, 64 hidden units: loads in seconds with ``--load-format dummy``."""
    vocab = vocabulary()
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": VOCAB_SIZE,
        "hidden_size": HIDDEN_SIZE,
        "intermediate_size": 128,
        "num_hidden_layers": 1,
        "num_attention_heads": NUM_HEADS,
        "num_key_value_heads": NUM_HEADS,
        "head_dim": HIDDEN_SIZE // NUM_HEADS,
        "hidden_act": "silu",
        "max_position_embeddings": 16384,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "bos_token_id": vocab["<s>"],
        "eos_token_id": vocab["</s>"],
        "pad_token_id": vocab["<unk>"],
    }


def tokenizer_config() -> dict[str, Any]:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "<unk>",
        "model_max_length": 16384,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        # A plain template so chat endpoints work: the messages' contents, space-joined.
        "chat_template": (
            "{% for m in messages %}{{ m['content'] }} {% endfor %}"
        ),
    }


def write_tiny_model(directory: Path) -> Path:
    """Write the model files into ``directory`` (created if needed) and return it."""
    directory.mkdir(parents=True, exist_ok=True)
    files = {
        "config.json": llama_config(),
        "tokenizer.json": tokenizer_json(),
        "tokenizer_config.json": tokenizer_config(),
        "generation_config.json": {
            "bos_token_id": vocabulary()["<s>"],
            "eos_token_id": vocabulary()["</s>"],
        },
    }
    for name, content in files.items():
        (directory / name).write_text(json.dumps(content, indent=1))
    return directory


def prompt(words: int) -> str:
    """A prompt of ``words`` in-vocabulary words (one token each)."""
    return " ".join(WORDS[i % len(WORDS)] for i in range(words))
