"""Writes the lab's tiny model folder (runs in the lab venv: needs `tokenizers`).

A Llama `config.json` (SGLang makes random weights for it with `--load-format dummy`) and a
byte-level BPE tokenizer trained here on generated text, so nothing is downloaded. Usage:
    python ppscope_lab_make_model.py DIR [LAYERS]
"""
import json
import random
import sys
from pathlib import Path

VOCAB = 1024


def config(layers: int) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": layers,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
        "vocab_size": VOCAB, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2,
    }


def corpus(n: int = 4000):
    rnd = random.Random(0)
    words = ["pipeline", "stage", "token", "batch", "decode", "prefill", "kernel", "graph",
             "expert", "router", "layer", "cache", "slot", "rank", "send", "receive", "the",
             "a", "of", "to", "and", "in", "is", "for", "on", "with", "as", "by", "at", "from"]
    for _ in range(n):
        yield " ".join(rnd.choice(words) + ("" if rnd.random() < .8 else str(rnd.randint(0, 99)))
                       for _ in range(rnd.randint(5, 40)))


def tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<unk>", "<s>", "</s>"]
    tok.train_from_iterator(corpus(), trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=special, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "model_max_length": 4096,
        "chat_template": "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n"
                         "{% endfor %}assistant:"}, indent=1))
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}))


def main() -> int:
    out = Path(sys.argv[1])
    layers = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config(layers), indent=1))
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    tokenizer(out)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
