"""A tiny, real, offline Qwen3 checkpoint that stands in for an LLM in tests and demos.

``build_tiny_model(dir)`` writes an ordinary Hugging Face folder: ``config.json`` (``Qwen3ForCausalLM``, 2 layers,
hidden 128, 2 query heads and 1 KV head of ``head_dim`` 64, tied embeddings, float32), ``model.safetensors``,
``generation_config.json``, and a tokenizer (``tokenizer.json`` + ``tokenizer_config.json``) with a Qwen-style chat
template, eos ``<|im_end|>`` and pad ``<|endoftext|>``. ``AutoModelForCausalLM`` / ``AutoTokenizer`` load it with no
network. Nothing is downloaded: a byte-level BPE tokenizer (1024 tokens) is trained here with the ``tokenizers``
library on a synthetic chat corpus, and the randomly initialised model is then trained on that corpus for about
half a minute on one CPU thread, fully seeded (same arguments, same machine: same weights; another CPU's float kernels
may train others, so the stamp records ``weights_sha256``).

The corpus makes **response length depend on the prompt**, as in real rollouts: "count to 7" (8 tokens with the
eos), "count to 240" (hundreds; training sequences are cut at 160 tokens, so those never stop inside a 128 cap),
"count down from 30", "repeat cat 12 times", "list the months", "list the letters of river", "add 385 and 47"
(column by column, with carries), "what is 12 times 7" (running sums), "tell a tiny|short|medium|long|endless story
about moon", "say cat", "is 5 bigger than 200", ... every answer ending with ``<|im_end|>``. The model is small and
briefly trained, so it follows these only roughly; sampled at temperature 1.0 with a 128-token cap, answers spread
from a couple of tokens to the cap (some short, most in between, roughly one in seven capped) and the prompt
accounts for a fair part of the spread (the kind of task, the story's size word, ...), the first tokens for more.

The **"modes" variant** (``tiny_model_path(variant="modes")``, ``.cache/tiny-model-modes/``; ``make-tiny-model DIR
--variant modes``) has the same size, tokenizer code and recipe on another corpus, trained 8000 steps (about two
minutes) so that it fits that corpus: chains of m steps
("count to 9", "add 41 and 13", "what is 7 times 6") answered at random in one of three modes whose first token
differs, ``answer : 9 .`` (direct), ``count : 1 2 ... 9 . answer : 9 .`` and ``step 1 : 0 + 1 = 1 . ...``. Sampled at
temperature 1 a group mixes the modes; the mode comes first and the length follows it (at k=8: count ~20 tokens,
step ~80), as a real LLM's "Let me think step by step" announces a long answer. ``model_prompts(dir)`` gives a
model's own corpus's prompts.

The **"learns" variant** (``tiny_model_path(variant="learns")``, the demo's model; 6000 steps, about a minute and a
half) answers short chains ("add 41 and 7", "count to 9") either with a guess, ``answer : v .``, right about a fifth
of the time, or by counting, ``count : ... . answer : v .``, mostly right; it counts about a third of the time. A
reward that checks the answer (``tasks.chains``) makes GRPO learn to count within a few steps.

The **"tools" variant** (``tiny_model_path(variant="tools")``, ``.cache/tiny-model-tools/``) is a tool agent: asked
"add 41 and 17" in the chat template's tool layout (``apply_chat_template(messages, tools=[calculator schema])``, as
verl's ToolAgentLoop renders it), it writes ``<tool_call>\n{"name": "calculator", "arguments": {"expression": "41 +
17"}}\n</tool_call>``, and after the tool's response (``<tool_response>\n41 + 17 = 58\n</tool_response>`` in a user
turn) answers ``answer : 58 .`` (``tiny_tools_corpus``; the tool is ``tasks.calculator``). Its tokenizer has the four
tool tags as single added tokens, as Qwen3's has; it has 4 attention heads (the others 2) and trains 1500 steps on
batches of 4096 tokens, about two minutes (127 s here): with 2 heads, or fewer steps, whether it learnt to copy the
question's numbers into the call depended on the seed and the step count (from 0 to 100% right expressions).
Measured with ``tiny_tools_eval.measure_tool_use`` (temperature 1, 256 held-out questions, 4 sampling seeds;
2026-12-02, weights ``349fd9a0...``): 99.6-100% of first turns are a call ``HermesToolParser`` parses, 99-100% with the
question's expression, and 98-99% of the answers after the tool's response are right. Built with ``seed=1`` (standing
in for another machine's float kernels): 99.6-100%, 97% and 89-91%.

Shifting stop times: add a constant to the ``<|im_end|>`` logit. With transformers, pass
``logits_processor=LogitsProcessorList([eos_bias_processor(tok.eos_token_id, bias)])`` to ``generate`` (the
processor's ``bias`` attribute may be changed between calls, or mid-run, to move the length distribution), or
``sequence_bias={(tok.eos_token_id,): bias}``; with vLLM, ``SamplingParams(logit_bias={eos_id: bias})``. A positive
bias makes answers shorter, a negative one longer (more of them hit the cap). ``length_histogram(..., eos_bias=b)``
measures the effect.

GPU engines: the weights are float32; pass ``dtype="bfloat16"`` (verl's rollout default) where a kernel wants it.

This module imports torch / transformers / tokenizers only inside functions, so importing it is cheap; nothing in
``verl_infsample.core`` imports it.

    infsample make-tiny-model DIR [--layers 2 --hidden 128 --heads 2 --kv-heads 1 --vocab 1024 --seed 0 --train-steps N]
                                  [--variant modes]   # first tokens tell the length (tiny_model_path(variant="modes"))
                                  [--variant learns]  # guesses or counts: the demo's model
                                  [--variant tools]   # calls a calculator (tool_call / tool_response turns)
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..tasks.chains import guess_or_count
from .tiny_corpus import CORPORA, TASKS, modes_example, synth_corpus, synth_example
from .tiny_dialogue import Dialogue, Segment
from .tiny_tools_corpus import TOOL_TOKENS

# Bump when the corpus, the tokenizer, the training recipe or the folder layout changes: cached models rebuild.
BUILD_VERSION = 1

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END]
STAMP_FILE = "tiny_model.json"

# Qwen3's layout without its thinking blocks: every message is <|im_start|>role\ncontent<|im_end|>\n and the
# generation prompt is the open assistant header. With ``tools``, a system turn lists them (after the system
# message's content, if the chat starts with one) and says how to call them; an assistant's ``tool_calls`` are written
# as <tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>, and ``tool`` messages as <tool_response> blocks inside
# one user turn per run of them. A chat without tools or tool messages renders as it always has (roles other than
# Qwen3's included), so models built before tools came render their prompts unchanged.
CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- set content = message['content'] if message['content'] is string else '' %}"
    "{%- if tools and loop.first and message['role'] == 'system' %}"
    "{%- elif message['role'] == 'assistant' and message['tool_calls'] %}"
    "{{- '<|im_start|>assistant\\n' + content }}"
    "{%- for tool_call in message['tool_calls'] %}"
    "{%- if (loop.first and content) or not loop.first %}{{- '\\n' }}{%- endif %}"
    "{%- if tool_call['function'] %}{%- set tool_call = tool_call['function'] %}{%- endif %}"
    "{{- '<tool_call>\\n{\"name\": \"' + tool_call['name'] + '\", \"arguments\": ' }}"
    "{%- if tool_call['arguments'] is string %}{{- tool_call['arguments'] }}"
    "{%- else %}{{- tool_call['arguments'] | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>' + '\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
DEFAULT_VOCAB = 1024
DEFAULT_TRAIN_STEPS = 1000
HEAD_DIM = 64  # some engines' attention kernels need head_dim >= 64

# The default build: what ``tiny_model_path`` caches, and what its fingerprint covers.
DEFAULTS: dict = dict(layers=2, hidden=128, heads=2, kv_heads=1, vocab=DEFAULT_VOCAB, seed=0,
                      train_steps=DEFAULT_TRAIN_STEPS, intermediate=None, corpus_size=6000, lr=3e-3,
                      batch_tokens=256, max_seq_len=160, max_position_embeddings=4096)
# Variants: build parameters over DEFAULTS. "modes": same size, tokenizer code and recipe, on the "modes" corpus
# (its first tokens tell the length), trained until it fits that corpus: at 1000 steps (loss 0.41) it followed its
# modes so loosely that no predictor could rank its lengths well (the Monte Carlo ceiling of ``eval-predictor
# --ceiling``: Kendall tau 0.48-0.58 at k=8); at 4000 it still drew its modes off the corpus's weights (count 49%,
# step 32%, direct 19% of 3072 samples; the corpus: 35 / 35 / 30) and cut step answers short (70 tokens on average);
# at 8000 (about a minute more) 41 / 36 / 22, closer to them, and 84 tokens (measured 2026-12-02).
# ``corpus`` enters the fingerprint only when it is not the default's.
MODES_TRAIN_STEPS = 8000
# "learns": the demo's model (``tasks.chains.guess_or_count``): guesses or counts, and only counting is reliably right.
LEARNS_TRAIN_STEPS = 6000
# "tools": calls a calculator (``tiny_tools_corpus``); its conversations (the tools' system turn included) are about
# 220 tokens, so sequences and batches are longer (the system turn, the same in every row, runs once a batch).
TOOLS_TRAIN_STEPS = 1500
VARIANTS: dict = {"default": {}, "modes": dict(corpus="modes", train_steps=MODES_TRAIN_STEPS),
                  "learns": dict(corpus="learns", train_steps=LEARNS_TRAIN_STEPS),
                  "tools": dict(corpus="tools", train_steps=TOOLS_TRAIN_STEPS, heads=4, max_seq_len=256,
                                batch_tokens=4096)}


@dataclass(frozen=True)
class TokenizerRecipe:
    """What a corpus's tokenizer does beyond the default byte-level BPE."""

    added_tokens: tuple[str, ...] = ()  # single, not special, tokens (Qwen3 has the tool tags as such)


TOKENIZER_RECIPES: dict[str, TokenizerRecipe] = {"tools": TokenizerRecipe(added_tokens=TOOL_TOKENS)}


def _check_variant(variant: str) -> str:
    if variant not in VARIANTS:
        raise ValueError(f"unknown tiny-model variant {variant!r}: one of {', '.join(VARIANTS)}")
    return variant

def default_prompts(n: int = 16, seed: int = 10_000, variant: str = "default") -> list[str]:
    """Held-out prompts (another seed than the training corpus), every kind in turn, for sampling and histograms;
    ``variant="modes"``: prompts of the "modes" corpus."""
    rng = random.Random(seed)
    corpus = VARIANTS[_check_variant(variant)].get("corpus")
    if corpus == "modes":
        return [modes_example(rng)[0] for _ in range(n)]
    if corpus == "learns":
        return [guess_or_count(rng)[0] for _ in range(n)]
    return [synth_example(rng, TASKS[i % len(TASKS)][0])[0] for i in range(n)]


def model_prompts(model_dir, n: int = 16, seed: int = 10_000) -> list[str]:
    """``default_prompts`` of the corpus ``model_dir`` was trained on (its stamp says; any other model: the
    default's)."""
    try:
        corpus = json.loads((Path(model_dir) / STAMP_FILE).read_text())["params"].get("corpus", "tasks")
    except (OSError, ValueError, KeyError):
        corpus = "tasks"
    return default_prompts(n, seed, variant=corpus if corpus in VARIANTS else "default")


def render_chat(prompt: str, answer: str | None = None) -> str:
    """The chat template by hand (what ``apply_chat_template`` renders), optionally with the assistant's answer."""
    text = f"{IM_START}user\n{prompt}{IM_END}\n{IM_START}assistant\n"
    return text if answer is None else text + answer + IM_END


# ------------------------------------------------------------------------------------------------------- building

def _resolve(params: dict) -> dict:
    p = {**DEFAULTS, "corpus": "tasks", **{k: v for k, v in params.items() if v is not None}}
    unknown = set(p) - set(DEFAULTS) - {"corpus"}
    if unknown:
        raise ValueError(f"unknown build parameter(s): {', '.join(sorted(unknown))}")
    if p["corpus"] not in CORPORA:
        raise ValueError(f"corpus must be one of {', '.join(CORPORA)}, got {p['corpus']!r}")
    for k in ("layers", "hidden", "heads", "kv_heads", "vocab", "corpus_size", "batch_tokens", "max_seq_len"):
        if int(p[k]) < 1:
            raise ValueError(f"{k} must be >= 1, got {p[k]}")
    if int(p["train_steps"]) < 0:
        raise ValueError(f"train_steps must be >= 0, got {p['train_steps']}")
    if p["heads"] % p["kv_heads"]:
        raise ValueError(f"heads ({p['heads']}) must be a multiple of kv_heads ({p['kv_heads']})")
    if p["vocab"] < 300:
        raise ValueError(f"vocab must be >= 300 (256 bytes + special tokens + merges), got {p['vocab']}")
    p["intermediate"] = int(p["intermediate"] or p["hidden"])
    return p


def fingerprint(params: dict | None = None) -> str:
    """A hash of the build: BUILD_VERSION plus every resolved parameter. Same fingerprint, same model."""
    p = _resolve(params or {})
    if p["corpus"] == "tasks":  # the default corpus: fingerprints (and cached folders) from before variants hold
        del p["corpus"]
    blob = json.dumps({"build_version": BUILD_VERSION, **p}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _dialogue(example) -> Dialogue:
    """A corpus example as a Dialogue: a (prompt, answer) pair is the prompt's chat (context) and the answer."""
    if isinstance(example, Dialogue):
        return example
    prompt, answer = example
    return Dialogue((Segment(render_chat(prompt), learn=False), Segment(answer + IM_END, learn=True)))


def _train_tokenizer(corpus: list[Dialogue], vocab: int, recipe: TokenizerRecipe = TokenizerRecipe()):
    """Byte-level BPE on the corpus; the recipe's added tokens become single (not special) tokens after the
    ``vocab`` trained ones, and the BPE never sees them (encoding splits them off first, as training here does)."""
    import re

    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    # GPT-2 style byte-level pre-tokenisation keeps " 123" a word, so common numbers become single tokens.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    added_tokens = recipe.added_tokens
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), min_frequency=2)
    texts = (d.text for d in corpus)
    if added_tokens:
        split = re.compile("|".join(re.escape(t) for t in added_tokens))
        texts = (piece for text in texts for piece in split.split(text) if piece)
    tok.train_from_iterator(texts, trainer=trainer)
    if added_tokens:
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in added_tokens])
    return tok


def _wrap_tokenizer(tok, model_max_length: int):
    from transformers import PreTrainedTokenizerFast

    # Left padding: what batched generation wants (verl pads for itself either way).
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=IM_END, pad_token=ENDOFTEXT, unk_token=None,
                                   bos_token=None, extra_special_tokens=[IM_START], chat_template=CHAT_TEMPLATE,
                                   model_max_length=model_max_length, padding_side="left",
                                   clean_up_tokenization_spaces=False)


def _encode_corpus(tok, corpus: list[Dialogue], max_seq_len: int) -> list[tuple[list[int], list[bool]]]:
    """Token ids and, per token, whether loss is taken on it (the learnt segments: answers and their <|im_end|>).

    ``tok`` is the raw ``tokenizers.Tokenizer``. Each segment is encoded on its own, as verl's agent loop builds a
    conversation turn by turn; a prompt is encoded exactly as the chat template renders it.
    """
    flat = [seg for d in corpus for seg in d.segments]
    encoded = iter(tok.encode_batch([seg.text for seg in flat], add_special_tokens=False))
    out = []
    for d in corpus:
        ids: list[int] = []
        learn: list[bool] = []
        for seg in d.segments:
            seg_ids = next(encoded).ids
            ids += seg_ids
            learn += [seg.learn] * len(seg_ids)
        out.append((ids[:max_seq_len], learn[:max_seq_len]))
    return out


def _batches(encoded, batch_tokens, rng: random.Random):
    """Token-budget batches of similar lengths (right-padded; causal attention never looks at the padding)."""
    order = sorted(range(len(encoded)), key=lambda i: (len(encoded[i][0]), rng.random()))
    batches, cur, cur_max = [], [], 0
    for i in order:
        n = len(encoded[i][0])
        if cur and max(cur_max, n) * (len(cur) + 1) > batch_tokens:
            batches.append(cur)
            cur, cur_max = [], 0
        cur.append(i)
        cur_max = max(cur_max, n)
    if cur:
        batches.append(cur)
    return batches


def build_tiny_model(out_dir, *, layers: int = 2, hidden: int = 128, heads: int = 2, kv_heads: int = 1,
                     vocab: int | None = None, seed: int = 0, train_steps: int | None = None,
                     intermediate: int | None = None, corpus_size: int | None = None, lr: float | None = None,
                     batch_tokens: int | None = None, max_seq_len: int | None = None,
                     max_position_embeddings: int | None = None, corpus: str | None = None, threads: int = 1,
                     verbose: bool = False) -> Path:
    """Write a Qwen3 checkpoint folder (config, model.safetensors, generation_config, tokenizer) to ``out_dir``.

    ``vocab`` is the BPE vocabulary size to train (default 1024; the config's ``vocab_size`` is the tokenizer's
    length); ``train_steps`` the number of AdamW steps (0: random weights). Everything is seeded by ``seed``: the same
    arguments on the same machine give the same bytes. ``out_dir`` must be empty, absent, or an earlier build.

    Training runs on ``threads`` torch threads (restored afterwards). One is the default on purpose: the result then
    does not depend on the machine's core count, and on a busy 2-core machine two OpenMP threads spin-wait against
    other processes and run many times slower than one.
    """
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    p = _resolve(dict(layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, vocab=vocab, seed=seed,
                      train_steps=train_steps, intermediate=intermediate, corpus_size=corpus_size, lr=lr,
                      batch_tokens=batch_tokens, max_seq_len=max_seq_len,
                      max_position_embeddings=max_position_embeddings, corpus=corpus))
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()) and not (out / STAMP_FILE).exists():
        raise ValueError(f"refusing to write a tiny model into non-empty {out} (not an earlier tiny-model build)")
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()

    examples = [_dialogue(e) for e in synth_corpus(p["corpus_size"], p["seed"], p["corpus"])]
    raw_tok = _train_tokenizer(examples, p["vocab"], TOKENIZER_RECIPES.get(p["corpus"], TokenizerRecipe()))
    hf_tok = _wrap_tokenizer(raw_tok, p["max_position_embeddings"])
    eos_id, pad_id = hf_tok.convert_tokens_to_ids(IM_END), hf_tok.convert_tokens_to_ids(ENDOFTEXT)
    encoded = _encode_corpus(raw_tok, examples, p["max_seq_len"])
    t_tok = time.perf_counter()

    config = Qwen3Config(
        vocab_size=len(hf_tok), hidden_size=p["hidden"], intermediate_size=p["intermediate"],
        num_hidden_layers=p["layers"], num_attention_heads=p["heads"], num_key_value_heads=p["kv_heads"],
        head_dim=HEAD_DIM, max_position_embeddings=p["max_position_embeddings"], rope_theta=10000.0,
        tie_word_embeddings=True, bos_token_id=pad_id, eos_token_id=eos_id, pad_token_id=pad_id,
        use_cache=True, attention_dropout=0.0, dtype="float32",
    )
    config.architectures = ["Qwen3ForCausalLM"]

    stats = {}
    with torch.random.fork_rng(devices=[]), _torch_threads(threads):
        torch.manual_seed(p["seed"])
        model = Qwen3ForCausalLM(config).float()
        if p["train_steps"]:
            stats = _train(model, encoded, p, verbose=verbose)
    t_train = time.perf_counter()
    model.eval()
    model.generation_config = GenerationConfig(
        bos_token_id=pad_id, eos_token_id=eos_id, pad_token_id=pad_id, do_sample=True, temperature=1.0, top_p=1.0,
        max_new_tokens=128)

    for name in ("model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
                 "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja", STAMP_FILE):
        (out / name).unlink(missing_ok=True)
    model.save_pretrained(out)
    hf_tok.save_pretrained(out)
    # Older transformers (4.x) and other loaders know the class by its 4.x name and read the template from here.
    tc_path = out / "tokenizer_config.json"
    tc = json.loads(tc_path.read_text())
    tc.update(tokenizer_class="PreTrainedTokenizerFast", chat_template=CHAT_TEMPLATE,
              additional_special_tokens=[IM_START])
    tc_path.write_text(json.dumps(tc, indent=2) + "\n")
    # The recipe is seeded, but training runs on this machine's float kernels: another CPU can end with other
    # weights (and other lengths). The weights' own hash names the build a measurement was made on.
    weights = hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()
    stamp = {"build_version": BUILD_VERSION, "fingerprint": fingerprint(p), "weights_sha256": weights, "params": p,
             "build_seconds": round(time.perf_counter() - t0, 2), "tokenizer_seconds": round(t_tok - t0, 2),
             "train_seconds": round(t_train - t_tok, 2), "eos_token_id": eos_id, "pad_token_id": pad_id,
             "vocab_size": len(hf_tok), "n_params": sum(t.numel() for t in model.parameters()), **stats}
    (out / STAMP_FILE).write_text(json.dumps(stamp, indent=2) + "\n")
    return out


def _lean_hidden(model, input_ids, cos, sin):
    """Qwen3's forward (causal, no padding mask, no cache), from the model's own modules without the wrappers.

    At these sizes much of the HF forward's time is bookkeeping (masks, outputs, kwargs); this computes the same final
    hidden states (the test suite checks it against ``model.model(...)``) with less of it.
    """
    import torch.nn.functional as F
    from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb

    inner = model.model
    b, t = input_ids.shape
    cos, sin = cos[:, :t], sin[:, :t]
    x = inner.embed_tokens(input_ids)
    for layer in inner.layers:
        attn = layer.self_attn
        h = layer.input_layernorm(x)
        q = attn.q_norm(attn.q_proj(h).view(b, t, -1, attn.head_dim)).transpose(1, 2)
        k = attn.k_norm(attn.k_proj(h).view(b, t, -1, attn.head_dim)).transpose(1, 2)
        v = attn.v_proj(h).view(b, t, -1, attn.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=attn.scaling, enable_gqa=True)
        x = x + attn.o_proj(o.transpose(1, 2).reshape(b, t, -1))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return inner.norm(x)


def _lean_hidden_shared_prefix(model, prefix_ids, suffix_ids, cos, sin):
    """``_lean_hidden`` of rows that all start with ``prefix_ids`` (1, P), for their suffixes (B, S) only: the prefix
    runs once and every suffix attends to its keys and values, as if each row ran whole."""
    import torch
    import torch.nn.functional as F
    from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb

    inner = model.model
    (b, s), p = suffix_ids.shape, prefix_ids.shape[1]
    mask = torch.ones(s, p + s, dtype=torch.bool).tril(diagonal=p)  # suffix token i sees prefix and suffix <= i
    xp, xs = inner.embed_tokens(prefix_ids), inner.embed_tokens(suffix_ids)
    for layer in inner.layers:
        attn = layer.self_attn

        def qkv(x, c, n):
            h = layer.input_layernorm(x)
            q = attn.q_norm(attn.q_proj(h).view(x.shape[0], n, -1, attn.head_dim)).transpose(1, 2)
            k = attn.k_norm(attn.k_proj(h).view(x.shape[0], n, -1, attn.head_dim)).transpose(1, 2)
            v = attn.v_proj(h).view(x.shape[0], n, -1, attn.head_dim).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, *c)
            return q, k, v

        qp, kp, vp = qkv(xp, (cos[:, :p], sin[:, :p]), p)
        qs, ks, vs = qkv(xs, (cos[:, p:p + s], sin[:, p:p + s]), s)
        op = F.scaled_dot_product_attention(qp, kp, vp, is_causal=True, scale=attn.scaling, enable_gqa=True)
        os_ = F.scaled_dot_product_attention(qs, torch.cat([kp.expand(b, -1, -1, -1), ks], dim=2),
                                             torch.cat([vp.expand(b, -1, -1, -1), vs], dim=2), attn_mask=mask,
                                             scale=attn.scaling, enable_gqa=True)
        xp = xp + attn.o_proj(op.transpose(1, 2).reshape(1, p, -1))
        xp = xp + layer.mlp(layer.post_attention_layernorm(xp))
        xs = xs + attn.o_proj(os_.transpose(1, 2).reshape(b, s, -1))
        xs = xs + layer.mlp(layer.post_attention_layernorm(xs))
    return inner.norm(xs)


# A batch whose rows share this many leading tokens (before anything learnt) runs them once (the "tools" corpus's
# system turn: about 170 tokens); the other corpora's rows share a few tokens at most and run whole.
SHARED_PREFIX_MIN = 64


def _shared_prefix(rows: list[tuple[list[int], list[bool]]]) -> int:
    """Leading tokens common to every row, up to the one before the first learnt token (its prediction comes
    from the suffix then)."""
    first = rows[0][0]
    limit = min(min(len(ids) for ids, _ in rows), min(learn.index(True) if True in learn else len(learn)
                                                      for _, learn in rows) - 1)
    n = 0
    while n < limit and all(ids[n] == first[n] for ids, _ in rows):
        n += 1
    return n


def _rope_tables(model, length: int):
    import torch

    pos = torch.arange(length).unsqueeze(0)
    return model.model.rotary_emb(model.model.embed_tokens.weight[:1, None, :], pos)


def _train(model, encoded, p: dict, verbose: bool = False) -> dict:
    import torch

    rng = random.Random(p["seed"] + 1)
    batches = _batches(encoded, p["batch_tokens"], rng)
    steps, lr = p["train_steps"], p["lr"]
    warmup = max(1, min(30, steps // 10))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.01, fused=True)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))))
    model.train()
    with torch.no_grad():
        cos, sin = _rope_tables(model, p["max_seq_len"])
    order: list[int] = []
    losses = []
    for step in range(steps):
        if not order:
            order = list(range(len(batches)))
            rng.shuffle(order)
        rows = [encoded[i] for i in batches[order.pop()]]
        width = max(len(ids) for ids, _ in rows)
        input_ids = torch.zeros(len(rows), width, dtype=torch.long)
        labels = torch.full((len(rows), width), -100, dtype=torch.long)
        for r, (ids, learn) in enumerate(rows):
            input_ids[r, :len(ids)] = torch.tensor(ids)
            labels[r, :len(ids)] = torch.where(torch.tensor(learn), torch.tensor(ids), -100)
        # No attention mask: padding is on the right and attention is causal, so real tokens never see it.
        # The LM head runs only where there is a target (answer tokens), which saves a good part of the compute.
        shared = _shared_prefix(rows)
        if shared >= SHARED_PREFIX_MIN:
            hidden = _lean_hidden_shared_prefix(model, input_ids[:1, :shared], input_ids[:, shared:], cos, sin)
            hidden, targets = hidden[:, :-1], labels[:, shared + 1:]
        else:
            hidden = _lean_hidden(model, input_ids, cos, sin)[:, :-1]
            targets = labels[:, 1:]
        keep = targets != -100
        logits = model.lm_head(hidden[keep])
        loss = torch.nn.functional.cross_entropy(logits, targets[keep])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if verbose and (step % 100 == 99 or step == steps - 1):
            recent = losses[-100:]
            print(f"tiny-model: step {step + 1:4d}/{steps}  loss {sum(recent) / len(recent):.3f}", file=sys.stderr)
    tail = losses[-20:]
    return {"train_steps_done": steps, "final_loss": round(sum(tail) / len(tail), 4)}


@contextlib.contextmanager
def _torch_threads(n: int | None):
    import torch

    before = torch.get_num_threads()
    if n:
        torch.set_num_threads(int(n))
    try:
        yield
    finally:
        torch.set_num_threads(before)


# ---------------------------------------------------------------------------------------------------- the cache

def _default_cache_root(variant: str = "default") -> Path:
    """``.cache/tiny-model/`` for the default; a variant's own sibling, ``.cache/tiny-model-<variant>/``."""
    name = "tiny-model" if variant == "default" else f"tiny-model-{variant}"
    env = os.environ.get("INFSAMPLE_TINY_MODEL_CACHE")
    if env:
        return Path(env) if variant == "default" else Path(env) / name
    repo = Path(__file__).resolve().parents[2]
    if (repo / "pyproject.toml").exists():
        return repo / ".cache" / name
    return Path.home() / ".cache" / "verl_infsample" / name


def _is_complete(folder: Path, fp: str) -> bool:
    try:
        stamp = json.loads((folder / STAMP_FILE).read_text())
    except (OSError, ValueError):
        return False
    return stamp.get("fingerprint") == fp and all(
        (folder / f).is_file() for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"))


def tiny_model_path(cache_root=None, variant: str = "default") -> Path:
    """The default tiny model's folder, built once (about 40 s of one CPU core) and cached.

    The cache is ``<repo>/.cache/tiny-model/`` (or ``$INFSAMPLE_TINY_MODEL_CACHE``, or ``cache_root``); the folder
    is named by the build's fingerprint, so a change of defaults or of ``BUILD_VERSION`` builds a new one. The build
    goes to a temporary folder that is renamed into place when complete, so a half-built model is never used.
    ``variant="modes"``: the model whose first tokens tell the length (``.cache/tiny-model-modes/``); the other
    variants likewise (``VARIANTS``).
    """
    params = {**DEFAULTS, **VARIANTS[_check_variant(variant)]}
    root = Path(cache_root) if cache_root is not None else _default_cache_root(variant)
    fp = fingerprint(params)
    final = root / (f"qwen3-tiny-{fp[:12]}" if variant == "default" else f"qwen3-tiny-{variant}-{fp[:12]}")
    if _is_complete(final, fp):
        return final
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".build-lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time: a concurrent caller waits, then finds it built
        if _is_complete(final, fp):
            return final
        tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=root))
        tmp.chmod(0o755)
        try:
            build_tiny_model(tmp, **params)
            if final.exists():  # a stale or broken folder is in the way
                shutil.rmtree(final, ignore_errors=True)
            os.rename(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


# --------------------------------------------------------------------------------------------- sampling lengths

def eos_bias_processor(eos_token_id, bias: float = 0.0):
    """A transformers ``LogitsProcessor`` adding ``bias`` to the eos logit(s): > 0 shortens answers, < 0 lengthens.

    ``bias`` is a plain attribute: change it between (or during) ``generate`` calls to move the length distribution.
    """
    from transformers import LogitsProcessor

    class EosBiasLogitsProcessor(LogitsProcessor):
        def __init__(self, ids, b):
            self.ids = [int(i) for i in (ids if isinstance(ids, (list, tuple)) else [ids])]
            self.bias = float(b)

        def __call__(self, input_ids, scores):
            if not self.bias:
                return scores
            scores = scores.clone()
            scores[:, self.ids] += self.bias
            return scores

    return EosBiasLogitsProcessor(eos_token_id, bias)


def sample_responses(model_dir, prompts: list[str], *, max_new_tokens: int = 128, seed: int = 0,
                     temperature: float = 1.0, eos_bias: float = 0.0, do_sample: bool = True,
                     batch_size: int = 64, model=None, tokenizer=None, threads: int = 1) -> list[list[int]]:
    """Generated token ids per prompt (one response per entry; repeat a prompt for a group), eos included."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LogitsProcessorList

    tok = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(model_dir)
    mdl = model if model is not None else AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    eos = tok.eos_token_id
    procs = LogitsProcessorList([eos_bias_processor(eos, eos_bias)] if eos_bias else [])
    texts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
             for q in prompts]
    out: list[list[int]] = []
    with torch.random.fork_rng(devices=[]), torch.no_grad(), _torch_threads(threads):
        torch.manual_seed(seed)
        for i in range(0, len(texts), batch_size):
            enc = tok(texts[i:i + batch_size], return_tensors="pt", padding=True, padding_side="left",
                      add_special_tokens=False)
            kw = dict(do_sample=True, temperature=temperature, top_p=1.0, top_k=None) if do_sample else dict(
                do_sample=False, temperature=None, top_p=None, top_k=None)
            gen = mdl.generate(**enc, max_new_tokens=max_new_tokens, logits_processor=procs, eos_token_id=eos,
                               pad_token_id=tok.pad_token_id, **kw)
            for row in gen[:, enc["input_ids"].shape[1]:].tolist():
                out.append(row[:row.index(eos) + 1] if eos in row else row)
    return out


def length_histogram(model_dir, prompts: list[str] | None = None, n: int = 64, max_new_tokens: int = 128,
                     seed: int = 0, *, temperature: float = 1.0, eos_bias: float = 0.0, model=None,
                     tokenizer=None, batch_size: int = 64) -> list[int]:
    """Sample ``n`` responses and return their lengths in tokens (eos counted; a capped one is ``max_new_tokens``).

    ``prompts`` default to ``default_prompts()`` (16, every task kind in turn); response ``i`` answers
    ``prompts[i % len(prompts)]``. Seeded: the same arguments give the same lengths. Pass ``model`` / ``tokenizer``
    to reuse loaded ones. For the README: ``plot_length_histogram(length_histogram(d), "lengths.png", 128)``.
    """
    prompts = list(prompts) if prompts else default_prompts()
    batch = [prompts[i % len(prompts)] for i in range(n)]
    return [len(r) for r in sample_responses(model_dir, batch, max_new_tokens=max_new_tokens, seed=seed,
                                             temperature=temperature, eos_bias=eos_bias, model=model,
                                             tokenizer=tokenizer, batch_size=batch_size)]


def plot_length_histogram(lengths: list[int], path, max_new_tokens: int | None = None, title: str | None = None):
    """A PNG histogram of response lengths (matplotlib, Agg backend); the cap, if given, is drawn as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cap = max_new_tokens or max(lengths)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.hist(lengths, bins=min(32, max(4, cap // 4)), range=(0, cap + 1), color="#4477aa", edgecolor="white")
    if max_new_tokens:
        ax.axvline(max_new_tokens, color="#cc3311", linestyle="--", linewidth=1, label=f"cap {max_new_tokens}")
        ax.legend()
    ax.set_xlabel("response length (tokens)")
    ax.set_ylabel("responses")
    ax.set_title(title or f"tiny model: {len(lengths)} sampled responses")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


# ------------------------------------------------------------------------------------------------------ the CLI

def add_make_tiny_model_parser(subparsers):
    """Register ``make-tiny-model DIR [...]`` on an argparse ``add_subparsers()`` object."""
    p = subparsers.add_parser("make-tiny-model", help="build the tiny offline Qwen3 model used by tests and demos",
                              description="Train a byte-level BPE tokenizer and a tiny Qwen3 model on a synthetic "
                                          "chat corpus (CPU, seconds) and write a Hugging Face folder to DIR.")
    p.add_argument("dir", help="output folder (absent, empty, or an earlier tiny-model build)")
    p.add_argument("--layers", type=int, default=DEFAULTS["layers"])
    p.add_argument("--hidden", type=int, default=DEFAULTS["hidden"])
    p.add_argument("--heads", type=int, default=DEFAULTS["heads"], help=f"attention heads (head_dim is {HEAD_DIM})")
    p.add_argument("--kv-heads", type=int, default=DEFAULTS["kv_heads"])
    p.add_argument("--vocab", type=int, default=DEFAULTS["vocab"], help="BPE vocabulary size to train")
    p.add_argument("--seed", type=int, default=DEFAULTS["seed"])
    p.add_argument("--train-steps", type=int, default=None,
                   help=f"0: random weights (default {DEFAULTS['train_steps']}; --variant modes: {MODES_TRAIN_STEPS})")
    p.add_argument("--variant", choices=list(VARIANTS), default="default",
                   help="modes: trained on answers whose first tokens tell their length (direct / count / step); "
                        "learns: the demo's model; tools: calls a calculator")
    p.set_defaults(func=cmd_make_tiny_model)
    return p


def cmd_make_tiny_model(args) -> int:
    t0 = time.perf_counter()
    variant = {**VARIANTS[args.variant]}
    if args.train_steps is not None:
        variant["train_steps"] = args.train_steps
    out = build_tiny_model(args.dir, layers=args.layers, hidden=args.hidden, heads=args.heads,
                           kv_heads=args.kv_heads, vocab=args.vocab, seed=args.seed, verbose=True, **variant)
    stamp = json.loads((out / STAMP_FILE).read_text())
    print(f"tiny model: {stamp['n_params']:,} parameters, vocab {stamp['vocab_size']}, "
          f"loss {stamp.get('final_loss', 'n/a')}, {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    print(out)
    return 0
