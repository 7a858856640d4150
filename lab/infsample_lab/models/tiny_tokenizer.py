"""The tiny model's tokenizer: byte-level BPE trained on its corpus, Qwen3's special tokens and chat template.

Imports ``tokenizers`` / ``transformers`` inside the functions only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .tiny_dialogue import Dialogue
from .tiny_tools_corpus import TOOL_TOKENS

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END]

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


@dataclass(frozen=True)
class TokenizerRecipe:
    """What a corpus's tokenizer does beyond the default byte-level BPE."""

    added_tokens: tuple[str, ...] = ()  # single, not special, tokens (Qwen3 has the tool tags as such)


TOKENIZER_RECIPES: dict[str, TokenizerRecipe] = {"tools": TokenizerRecipe(added_tokens=TOOL_TOKENS)}


def render_chat(prompt: str, answer: str | None = None) -> str:
    """The chat template by hand (what ``apply_chat_template`` renders), optionally with the assistant's answer."""
    text = f"{IM_START}user\n{prompt}{IM_END}\n{IM_START}assistant\n"
    return text if answer is None else text + answer + IM_END


def train_tokenizer(corpus: list[Dialogue], vocab: int, recipe: TokenizerRecipe = TokenizerRecipe()):
    """Byte-level BPE on the corpus; the recipe's added tokens become single (not special) tokens after the
    ``vocab`` trained ones, and the BPE never sees them (encoding splits them off first, as training here does)."""
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


def wrap_tokenizer(tok, model_max_length: int):
    """The trained tokenizer as transformers loads it: eos ``<|im_end|>``, pad ``<|endoftext|>``, the chat template,
    and left padding, what batched generation wants (verl pads for itself either way)."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=IM_END, pad_token=ENDOFTEXT, unk_token=None,
                                   bos_token=None, extra_special_tokens=[IM_START], chat_template=CHAT_TEMPLATE,
                                   model_max_length=model_max_length, padding_side="left",
                                   clean_up_tokenization_spaces=False)
