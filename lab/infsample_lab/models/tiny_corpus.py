"""The tiny model's synthetic chat corpora, in which the answer's length depends on the prompt (as in real rollouts).

``tasks`` (the default model's): "count to 7", "count down from 30", "repeat cat 12 times", "list the months", "add
385 and 47" (column by column, with carries), "what is 12 times 7" (running sums), "tell a tiny|short|medium|long|
endless story about moon", "say cat", "is 5 bigger than 200", ... ``modes`` (the "modes" variant's): chains of m
steps (``tasks.chains.chain_prompt``) answered in one of three modes whose first token announces the length.
``learns``: the demo's chains, guessed or counted (``tasks.chains.guess_or_count``). ``tools``
(``tiny_tools_corpus``): arithmetic questions (``tasks.tool_arithmetic``) answered through a calculator call.
``tiny_train`` trains on them: a change here changes the models, so bump ``tiny_recipe.BUILD_VERSION`` with it.

A corpus example is a (prompt, answer) pair, a one-turn chat, or a ``Dialogue`` (several turns, some learnt).
"""

from __future__ import annotations

import random

from ..tasks.chains import chain_prompt, guess_or_count
from ..tasks.draws import loguniform
from .tiny_dialogue import Dialogue
from .tiny_tools_corpus import tools_example

WORDS = [
    "cat", "dog", "sun", "sky", "tree", "river", "apple", "house", "green", "stone", "cloud", "bread", "music",
    "light", "water", "tiger", "robot", "pencil", "garden", "window", "orange", "purple", "rocket", "planet",
    "castle", "dragon", "banana", "forest", "silver", "winter", "summer", "yellow", "bottle", "candle", "flower",
    "monkey", "island", "bridge", "engine", "camera", "mirror", "pillow", "rabbit", "turtle", "violin", "wizard",
    "lemon", "ocean", "table", "chair", "horse", "mouse", "train", "plane", "snow", "rain", "wind", "fire", "moon",
    "star", "book", "door", "fish", "bird", "frog", "milk", "cake", "salt", "gold", "ship",
]
GREETINGS = [
    ("hi", "hi! how can i help?"),
    ("hello", "hello! what can i do for you?"),
    ("thanks", "you are welcome."),
    ("who are you", "i am a tiny model."),
    ("ok", "ok."),
]


def _add_steps(a: int, b: int) -> str:
    """Column addition, ones first: 'add 385 and 47' -> '5 + 7 = 12 , write 2 carry 1 . 8 + 4 + 1 = 13 , ...'"""
    da, db = str(a)[::-1], str(b)[::-1]
    carry, parts = 0, []
    for i in range(max(len(da), len(db))):
        x = int(da[i]) if i < len(da) else 0
        y = int(db[i]) if i < len(db) else 0
        s = x + y + carry
        terms = f"{x} + {y}" + (f" + {carry}" if carry else "")
        carry = s // 10
        parts.append(f"{terms} = {s} , write {s % 10}" + (f" carry {carry}" if carry else ""))
    if carry:
        parts.append(f"write {carry}")
    return " . ".join(parts) + f" . so {a} + {b} = {a + b}"


def _count_to(rng):
    n = loguniform(rng, 2, 300)
    return f"count to {n}", " ".join(str(i) for i in range(1, n + 1))


def _count_from(rng):
    a = rng.randint(1, 150)
    b = a + loguniform(rng, 2, 150)
    return f"count from {a} to {b}", " ".join(str(i) for i in range(a, b + 1))


def _count_down(rng):
    n = loguniform(rng, 2, 250)
    return f"count down from {n}", " ".join(str(i) for i in range(n, 0, -1)) + " go"


def _multiples(rng):
    k = rng.randint(2, 10)
    m = k * loguniform(rng, 2, 120)
    return f"list the multiples of {k} up to {m}", " ".join(str(k * i) for i in range(1, m // k + 1))


def _repeat(rng):
    w = rng.choice(WORDS)
    n = loguniform(rng, 2, 250)
    return f"repeat {w} {n} times", " ".join([w] * n)


def _letters(rng):
    w = rng.choice(WORDS)
    if rng.random() < 0.5:
        return f"list the letters of {w}", " ".join(w)
    return f"spell {w} backwards", " ".join(reversed(w))


def _add(rng):
    a = loguniform(rng, 10, 9999)
    b = loguniform(rng, 10, 9999)
    return f"add {a} and {b}", _add_steps(a, b)


def _times(rng):
    a = loguniform(rng, 2, 40)
    b = rng.randint(2, 12)
    sums = " , ".join(str(b * i) for i in range(1, a + 1))
    return f"what is {a} times {b}", f"{sums} . so {a} times {b} is {a * b}"


# A story's length (in sentences) is drawn from its size class: the prompt says roughly how long the answer is.
STORY_SIZES = {"tiny": (1, 1), "short": (2, 4), "medium": (4, 10), "long": (10, 22), "endless": (40, 80)}
STORY_SENTENCES = ["the {t} is here .", "the {t} sees a {w} .", "a {w} likes the {t} .", "then the {t} sleeps .",
                   "the {t} and the {w} play .", "the {t} is {c} ."]
COLOURS = ["red", "blue", "green", "yellow", "purple", "orange", "silver", "gold"]


def _story(rng):
    size = rng.choice(list(STORY_SIZES))
    t = rng.choice(WORDS)
    n = rng.randint(*STORY_SIZES[size])
    sentences = [rng.choice(STORY_SENTENCES).format(t=t, w=rng.choice(WORDS), c=rng.choice(COLOURS))
                 for _ in range(n)]
    return f"tell a {size} story about {t}", " ".join(sentences) + " the end ."


# Fixed answers whose length the prompt's key word gives away exactly.
LISTS = {
    "the days of the week": "monday tuesday wednesday thursday friday saturday sunday",
    "the months": "january february march april may june july august september october november december",
    "the alphabet": " ".join("abcdefghijklmnopqrstuvwxyz"),
    "the colours": " ".join(COLOURS),
    "the numbers up to ten in words": "one two three four five six seven eight nine ten",
    "the seasons": "spring summer autumn winter",
    "the planets": "mercury venus earth mars jupiter saturn uranus neptune",
    "the animals": " ".join(["cat", "dog", "tiger", "monkey", "rabbit", "turtle", "horse", "mouse", "fish", "bird",
                             "frog", "dragon"]),
}


def _fixed_list(rng):
    what = rng.choice(list(LISTS))
    answer = LISTS[what]
    if rng.random() < 0.3:
        return f"list {what} twice", f"{answer} . {answer}"
    return f"list {what}", answer


def _short(rng):
    r = rng.random()
    if r < 0.4:
        w = rng.choice(WORDS)
        return f"say {w}", w
    if r < 0.75:
        a, b = rng.randint(0, 300), rng.randint(0, 300)
        return f"is {a} bigger than {b}", "yes" if a > b else "no"
    return rng.choice(GREETINGS)


# (kind, weight, generator); answers run from one token ("yes") to a few hundred ("count to 280").
TASKS = [("count_to", 14, _count_to), ("count_from", 5, _count_from), ("count_down", 9, _count_down),
         ("multiples", 5, _multiples), ("repeat", 10, _repeat), ("letters", 5, _letters), ("add", 6, _add),
         ("times", 6, _times), ("story", 20, _story), ("lists", 8, _fixed_list), ("short", 12, _short)]


# --- the "modes" variant: the same prompt answered in modes whose first tokens announce the length ----------------
# Real LLMs announce a long answer early ("Let me think step by step ...") and a short one too ("The answer is");
# the default corpus does not (its answers' first tokens say little about where they end). Here every prompt is a
# chain of m steps (count to m, add a and m, m times b) answered at random in one of three modes, which share no
# first token: ``answer : v .`` (direct, ~5 tokens), ``count : v1 v2 ... vm . answer : vm .`` (~m + 8) and
# ``step 1 : v0 + d = v1 . step 2 : ...`` (~8 m, often past a 128 cap). The mode is drawn per sample, so at
# temperature 1 a group mixes them; once the mode is out (the first token), the length follows it and m.
MODE_WEIGHTS = {"direct": 0.3, "count": 0.35, "step": 0.35}
MODES_MAX_STEPS = 24


def modes_example(rng: random.Random, mode: str | None = None) -> tuple[str, str]:
    """One (prompt, answer) pair of the "modes" corpus; ``mode`` (direct, count, step) is drawn by weight if None."""
    prompt, start, inc, m = chain_prompt(rng, MODES_MAX_STEPS)
    if mode is None:
        mode = rng.choices(list(MODE_WEIGHTS), weights=list(MODE_WEIGHTS.values()))[0]
    values = [start + inc * i for i in range(m + 1)]
    if mode == "direct":
        return prompt, f"answer : {values[-1]} ."
    if mode == "count":
        return prompt, "count : " + " ".join(map(str, values[1:])) + f" . answer : {values[-1]} ."
    if mode == "step":
        steps = " ".join(f"step {i} : {values[i - 1]} + {inc} = {values[i]} ." for i in range(1, m + 1))
        return prompt, f"{steps} answer : {values[-1]} ."
    raise ValueError(f"unknown mode {mode!r}: one of {', '.join(MODE_WEIGHTS)}")


def synth_example(rng: random.Random, kind: str | None = None) -> tuple[str, str]:
    """One (prompt, answer) pair of ``kind`` (default: drawn by weight); the answer's length follows the prompt."""
    if kind is None:
        kind = rng.choices([k for k, _, _ in TASKS], weights=[w for _, w, _ in TASKS])[0]
    return {k: f for k, _, f in TASKS}[kind](rng)


# Training corpora by name: "tasks" (the default model's), "modes", "learns" and "tools" (those variants').
CORPORA = ("tasks", "modes", "learns", "tools")


def synth_corpus(n: int, seed: int = 0, corpus: str = "tasks") -> list[tuple[str, str]] | list[Dialogue]:
    rng = random.Random(seed)
    if corpus == "tools":
        return [tools_example(rng) for _ in range(n)]
    if corpus == "modes":
        return [modes_example(rng) for _ in range(n)]
    if corpus == "learns":
        return [guess_or_count(rng) for _ in range(n)]
    return [synth_example(rng) for _ in range(n)]
