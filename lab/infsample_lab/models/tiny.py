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

One module per piece, gathered here: ``tiny_recipe`` (the build's parameters, variants and fingerprint),
``tiny_tokenizer`` (the BPE, special tokens and chat template), ``tiny_train`` (the training loop), ``tiny_build``
(a model folder, and the cache of builds), ``tiny_sampling`` (held-out prompts, sampled lengths, histograms) and
``tiny_cli`` (``make-tiny-model``); the corpora are ``tiny_corpus`` and ``tiny_tools_corpus``. They import torch /
transformers / tokenizers only inside functions, so importing this module is cheap; nothing in
``verl_infsample.core`` imports it.

    infsample make-tiny-model DIR [--layers 2 --hidden 128 --heads 2 --kv-heads 1 --vocab 1024 --seed 0 --train-steps N]
                                  [--variant modes]   # first tokens tell the length (tiny_model_path(variant="modes"))
                                  [--variant learns]  # guesses or counts: the demo's model
                                  [--variant tools]   # calls a calculator (tool_call / tool_response turns)
"""

from __future__ import annotations

from .tiny_build import STAMP_FILE, build_tiny_model, tiny_model_path
from .tiny_cli import add_make_tiny_model_parser, cmd_make_tiny_model
from .tiny_recipe import BUILD_VERSION, DEFAULTS, VARIANTS, fingerprint
from .tiny_sampling import (default_prompts, eos_bias_processor, length_histogram, model_prompts,
                            plot_length_histogram, sample_responses)
from .tiny_tokenizer import CHAT_TEMPLATE, render_chat

__all__ = ["BUILD_VERSION", "CHAT_TEMPLATE", "DEFAULTS", "STAMP_FILE", "VARIANTS", "add_make_tiny_model_parser",
           "build_tiny_model", "cmd_make_tiny_model", "default_prompts", "eos_bias_processor", "fingerprint",
           "length_histogram", "model_prompts", "plot_length_histogram", "render_chat", "sample_responses",
           "tiny_model_path"]
