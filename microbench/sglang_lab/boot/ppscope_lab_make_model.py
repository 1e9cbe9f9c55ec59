"""Writes the lab's tiny model folder (runs in the lab venv: needs `tokenizers`).

A Llama `config.json` (SGLang makes random weights for it with `--load-format dummy`) and a
byte-level BPE tokenizer trained here on generated text, so nothing is downloaded. Usage:
    python ppscope_lab_make_model.py DIR [LAYERS]

Every token the random model can emit must decode to text of its own. bench_serving counts a
token only when its streamed chunk carries text (SGLang 0.5.23 benchmark/serving.py: the first
chunk with text is the TTFT), and SGLang's detokenizer holds back text that ends in an incomplete
UTF-8 sequence. So the alphabet is the corpus's own ASCII characters (no lone high bytes) and the
model's vocab_size is the tokenizer's: no id without a token. The first lab model (vocab 1024,
468 tokens, all 256 byte symbols) gave 687 of its 1024 ids no text, and requests whose greedy
tokens fell there showed their first token at the end of the run. The second still had three:
`<unk>`, `<s>`, `</s>` (ids 0-2, kept for config.json's bos and eos ids) were special tokens, which
SGLang's detokenizer skips (skip_special_tokens); a request whose greedy tokens began there had
its TTFT late and its TPOT low (43 of 1024 tokens in one twin run). They are plain added tokens
now, decoded as their own text; nothing declares a bos, eos or unk token to the tokenizer (the
server's bench asks for a fixed output length and ignores eos).
"""
import json
import random
import sys
from pathlib import Path

VOCAB = 1024          # the most the trainer may make; the corpus gives fewer
VERSION = 3           # ensure_model rebuilds a model folder of another version


def config(layers: int, vocab: int) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": layers,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
        "vocab_size": vocab, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
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


def tokenizer(out: Path) -> int:
    """Trains and writes the tokenizer; returns its vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    reserved = ["<unk>", "<s>", "</s>"]           # ids 0, 1, 2: config.json's bos and eos ids
    tok.train_from_iterator(corpus(), trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=reserved, show_progress=False))
    spec = json.loads(tok.to_str())
    for t in spec["added_tokens"]:
        t["special"] = False                      # decoded as text: see the docstring
    (out / "tokenizer.json").write_text(json.dumps(spec))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 4096,
        "chat_template": "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n"
                         "{% endfor %}assistant:"}, indent=1))
    (out / "special_tokens_map.json").write_text("{}")
    return tok.get_vocab_size()


def main() -> int:
    out = Path(sys.argv[1])
    layers = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    out.mkdir(parents=True, exist_ok=True)
    vocab = tokenizer(out)
    (out / "config.json").write_text(json.dumps(config(layers, vocab), indent=1))
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    (out / "ppscope-model.json").write_text(json.dumps({"version": VERSION}))
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
