"""Knights and knaves: a seeded puzzle generator, an exact solver, and a rule reward for verl.

On the island every inhabitant is a *knight* (always tells the truth) or a *knave* (always lies). Each of the n
inhabitants (n = the difficulty) makes one statement built from atoms "X is a knight" / "X is a knave" and the
connectives not, and, or (inclusive), if-then and if-and-only-if. A puzzle is kept only when exactly one of the
2^n role assignments is consistent (inhabitant i is a knight <=> statement i is true); otherwise it is regenerated.

Statements are trees of plain lists (JSON-serialisable as they are):

    ["lit", i, true]        inhabitant i is a knight        ["lit", i, false]   inhabitant i is a knave
    ["not", s]              ["and", [s1, s2, ...]]           ["or", [s1, s2, ...]]
    ["imp", a, b]           if a then b                      ["iff", a, b]       a if and only if b

Answer format (stated in every prompt, checked by :func:`compute_score`): the response ends with a line
``CONCLUSION:`` followed by one line per inhabitant, in the order they were introduced::

    CONCLUSION:
    (1) Zoey is a knight
    (2) Oliver is a knave

Reward policy (:func:`compute_score`, the keyword arguments can be set through verl's
``reward.custom_reward_function.reward_kwargs``):

* ``score`` (1.0): there is a ``CONCLUSION:`` marker, and after the last one every inhabitant's role is stated
  exactly once (one role, no contradiction) and every role is right.
* ``format_score`` (0.1): the answer is well formed (marker present, every inhabitant given exactly one role) but
  at least one role is wrong. No credit for partly right answers: guessing the roles of a few inhabitants is not
  rewarded beyond the format.
* 0.0: anything else: no marker, an inhabitant missing, an inhabitant stated as both knight and knave, or garbage.
  Malformed model output never raises.

Only the text after the last ``CONCLUSION:`` is read (so "suppose Zoey is a knight" in the reasoning does not
count); the ``(k)`` numbering and the order of the lines are not checked, names are matched case-insensitively
as whole words.

Pure Python + numpy; nothing here imports torch, Ray or verl.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np

DATA_SOURCE = "knights_knaves"
ABILITY = "logic"
MIN_PEOPLE = 2
MAX_PEOPLE = 8
KNIGHT, KNAVE = "knight", "knave"

# 40 distinct first names; none is an English word that appears in the puzzle text, none is "Alice"/"Bob" (used in
# the format example of the instruction).
NAMES = (
    "Zoey", "Oliver", "Ella", "Liam", "Mia", "Noah", "Ava", "Ethan", "Sofia", "Lucas",
    "Chloe", "Mason", "Harper", "Logan", "Aria", "Jacob", "Lily", "Owen", "Nora", "Henry",
    "Ruby", "Caleb", "Stella", "Isaac", "Hazel", "Leo", "Violet", "Samuel", "Aurora", "Jack",
    "Emma", "Daniel", "Grace", "Wyatt", "Scarlett", "Gabriel", "Ivy", "Julian", "Luna", "Elijah",
)

PREAMBLE = (
    "A very special island is inhabited only by knights and knaves. Knights always tell the truth, and knaves "
    "always lie."
)

INSTRUCTION = (
    'Think step by step. In a statement, "I" refers to the speaker, and "or" is inclusive (it is true when at least '
    "one part is true). At the end of your response, write a line \"CONCLUSION:\" followed by exactly one line per "
    "inhabitant, in the order they were introduced, of the form \"(1) Alice is a knight\" or \"(2) Bob is a "
    'knave". Every inhabitant must be listed.'
)

MARKER_RE = re.compile(r"conclusion\s*[*_]*\s*:", re.IGNORECASE)
_MAX_SECTION_CHARS = 8000  # the answer section is at most a few hundred characters; bound the regex work


# ----------------------------------------------------------------------------------------------------------------
# statements: evaluation and rendering


def _is_compound(node: Sequence) -> bool:
    return node[0] != "lit" and not (node[0] == "not" and node[1][0] == "lit")


def eval_statement(node: Sequence, knights: np.ndarray) -> np.ndarray:
    """Truth of ``node`` under every row of ``knights`` (bool array, shape (k, n): knights[r, i] = i is a knight)."""
    op = node[0]
    if op == "lit":
        col = knights[:, int(node[1])]
        return col if node[2] else ~col
    if op == "not":
        return ~eval_statement(node[1], knights)
    if op == "and":
        out = np.ones(knights.shape[0], dtype=bool)
        for child in node[1]:
            out &= eval_statement(child, knights)
        return out
    if op == "or":
        out = np.zeros(knights.shape[0], dtype=bool)
        for child in node[1]:
            out |= eval_statement(child, knights)
        return out
    if op == "imp":
        return ~eval_statement(node[1], knights) | eval_statement(node[2], knights)
    if op == "iff":
        return eval_statement(node[1], knights) == eval_statement(node[2], knights)
    raise ValueError(f"unknown statement node {op!r}")


def all_assignments(n: int) -> np.ndarray:
    """The 2^n role assignments as a bool array of shape (2^n, n); row r, column i = bit i of r (True = knight)."""
    codes = np.arange(1 << n, dtype=np.int64)[:, None]
    return ((codes >> np.arange(n, dtype=np.int64)[None, :]) & 1).astype(bool)


def solve(statements: Sequence[Sequence]) -> list[tuple[bool, ...]]:
    """Every consistent assignment (tuple of bools, True = knight), by exhaustive enumeration over 2^n."""
    n = len(statements)
    knights = all_assignments(n)
    ok = np.ones(knights.shape[0], dtype=bool)
    for i, stmt in enumerate(statements):
        ok &= knights[:, i] == eval_statement(stmt, knights)
    return [tuple(bool(x) for x in row) for row in knights[ok]]


def _subject(idx: int, speaker: int, names: Sequence[str]) -> tuple[str, str]:
    return ("I", "am") if idx == speaker else (names[idx], "is")


def render_statement(node: Sequence, speaker: int, names: Sequence[str]) -> str:
    """English for ``node`` said by ``speaker``; nested compound parts are parenthesised, so the text is unambiguous."""
    op = node[0]
    if op == "lit":
        who, verb = _subject(int(node[1]), speaker, names)
        return f"{who} {verb} a {KNIGHT if node[2] else KNAVE}"
    if op == "not":
        child = node[1]
        if child[0] == "lit":
            who, verb = _subject(int(child[1]), speaker, names)
            return f"{who} {verb} not a {KNIGHT if child[2] else KNAVE}"
        return "it is not the case that " + _part(child, speaker, names)
    if op in ("and", "or"):
        return f" {op} ".join(_part(c, speaker, names) for c in node[1])
    if op == "imp":
        return f"if {_part(node[1], speaker, names)} then {_part(node[2], speaker, names)}"
    if op == "iff":
        return f"{_part(node[1], speaker, names)} if and only if {_part(node[2], speaker, names)}"
    raise ValueError(f"unknown statement node {op!r}")


def _part(node: Sequence, speaker: int, names: Sequence[str]) -> str:
    text = render_statement(node, speaker, names)
    return f"({text})" if _is_compound(node) else text


def _capitalize(text: str) -> str:
    return text[:1].upper() + text[1:]


def _join_names(names: Sequence[str]) -> str:
    if len(names) <= 2:
        return " and ".join(names)
    return ", ".join(names[:-1]) + ", and " + names[-1]


# ----------------------------------------------------------------------------------------------------------------
# puzzles


@dataclass(frozen=True)
class Puzzle:
    """A knights-and-knaves puzzle with exactly one solution. ``solution[i]`` is True when ``names[i]`` is a knight."""

    names: tuple[str, ...]
    statements: tuple  # one statement tree (nested lists) per inhabitant
    solution: tuple[bool, ...]

    @property
    def n(self) -> int:
        return len(self.names)

    @property
    def roles(self) -> list[str]:
        return [KNIGHT if k else KNAVE for k in self.solution]

    def question(self) -> str:
        """The puzzle itself (no answer-format instruction)."""
        said = " ".join(
            f'{self.names[i]} says, "{_capitalize(render_statement(s, i, self.names))}."'
            for i, s in enumerate(self.statements)
        )
        return (f"{PREAMBLE} You meet {self.n} inhabitants: {_join_names(self.names)}. {said} "
                "So who is a knight and who is a knave?")

    def prompt(self) -> str:
        """What the model sees: the puzzle and the answer-format instruction."""
        return f"{self.question()}\n\n{INSTRUCTION}"

    def answer(self) -> str:
        """The canonical final answer (scores 1.0)."""
        return format_answer(self.names, self.roles)

    def ground_truth(self) -> str:
        """JSON object name -> "knight"/"knave", in introduction order (what the parquet's reward_model carries)."""
        return json.dumps(dict(zip(self.names, self.roles)))

    def statements_json(self) -> str:
        return json.dumps(self.statements)


def format_answer(names: Sequence[str], roles: Sequence[str]) -> str:
    lines = [f"({i + 1}) {name} is a {role}" for i, (name, role) in enumerate(zip(names, roles))]
    return "CONCLUSION:\n" + "\n".join(lines)


def _literal(rng: random.Random, idx: int) -> list:
    lit = ["lit", idx, rng.random() < 0.5]
    return ["not", lit] if rng.random() < 0.15 else lit


def _compound(rng: random.Random, speaker: int, n: int, depth: int) -> list:
    """A compound statement; its literals name distinct inhabitants (the speaker may refer to itself as "I")."""
    op = rng.choice(("and", "or", "imp", "iff", "and", "or"))
    arity = 3 if op in ("and", "or") and n >= 4 and rng.random() < 0.3 else 2
    people = rng.sample(range(n), arity)
    children: list = []
    for p in people:
        if depth > 1 and rng.random() < 0.35 and n >= 4:
            children.append(_compound(rng, speaker, n, depth - 1))
        else:
            children.append(_literal(rng, p))
    if rng.random() < 0.1:
        return ["not", [op, children] if op in ("and", "or") else [op, *children]]
    return [op, children] if op in ("and", "or") else [op, *children]


def random_statement(rng: random.Random, speaker: int, n: int) -> list:
    """One random statement of ``speaker`` (a lone atom never refers to the speaker: "I am a knave" is a paradox)."""
    others = [p for p in range(n) if p != speaker]
    r = rng.random()
    if r < 0.25:
        return _literal(rng, rng.choice(others))
    depth = 2 if n >= 5 and r > 0.8 else 1
    return _compound(rng, speaker, n, depth)


def generate_puzzle(n_people: int, rng: random.Random, max_tries: int = 10_000) -> Puzzle:
    """A random puzzle with ``n_people`` inhabitants and exactly one solution (rejection sampling)."""
    if not MIN_PEOPLE <= n_people <= len(NAMES):
        raise ValueError(f"n_people must be in [{MIN_PEOPLE}, {len(NAMES)}], got {n_people}")
    for _ in range(max_tries):
        names = tuple(rng.sample(NAMES, n_people))
        statements = tuple(random_statement(rng, i, n_people) for i in range(n_people))
        sols = solve(statements)
        if len(sols) == 1:
            return Puzzle(names=names, statements=statements, solution=sols[0])
    raise RuntimeError(f"no puzzle with a unique solution in {max_tries} tries (n={n_people})")  # pragma: no cover


def generate_puzzles(count: int, min_people: int = MIN_PEOPLE, max_people: int = MAX_PEOPLE,
                     seed: int | str = 0, exclude: Iterable[str] = ()) -> list[Puzzle]:
    """``count`` distinct puzzles, difficulties cycling min_people..max_people (balanced), deterministic in ``seed``.

    Puzzles whose question text is in ``exclude`` (or already generated) are skipped, so splits do not overlap.
    """
    if min_people > max_people:
        raise ValueError(f"min_people ({min_people}) > max_people ({max_people})")
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    rng = random.Random(f"knights_knaves:{seed}")
    seen = set(exclude)
    out: list[Puzzle] = []
    span = max_people - min_people + 1
    misses = 0
    while len(out) < count:
        puzzle = generate_puzzle(min_people + len(out) % span, rng)
        q = puzzle.question()
        if q in seen:
            misses += 1
            if misses > 100 * (count + 10):
                raise RuntimeError("cannot generate enough distinct puzzles; widen the difficulty range")
            continue
        seen.add(q)
        out.append(puzzle)
    return out


def make_splits(n_train: int, n_test: int, min_people: int = MIN_PEOPLE, max_people: int = MAX_PEOPLE,
                seed: int = 0) -> tuple[list[Puzzle], list[Puzzle]]:
    """Train and test puzzles from independent seeded streams; no test puzzle appears in train."""
    test = generate_puzzles(n_test, min_people, max_people, seed=f"{seed}:test")
    train = generate_puzzles(n_train, min_people, max_people, seed=f"{seed}:train",
                             exclude=[p.question() for p in test])
    return train, test


# ----------------------------------------------------------------------------------------------------------------
# verl rows


def to_verl_rows(puzzles: Sequence[Puzzle], split: str, data_source: str = DATA_SOURCE) -> list[dict]:
    """verl's parquet rows (the layout of verl's examples/data_preprocess/gsm8k.py).

    ``reward_model.ground_truth`` is a JSON string (a dict would become a parquet struct whose fields differ per
    row); :func:`compute_score` parses it.
    """
    rows = []
    for idx, p in enumerate(puzzles):
        rows.append({
            "data_source": data_source,
            "prompt": [{"role": "user", "content": p.prompt()}],
            "ability": ABILITY,
            "reward_model": {"style": "rule", "ground_truth": p.ground_truth()},
            "extra_info": {
                "split": split,
                "index": idx,
                "n_people": p.n,
                "question": p.question(),
                "answer": p.answer(),
                "statements": p.statements_json(),
            },
        })
    return rows


# ----------------------------------------------------------------------------------------------------------------
# reward


def parse_ground_truth(ground_truth: Any) -> dict[str, str]:
    """name -> "knight"/"knave" from the JSON string (or dict) in reward_model.ground_truth."""
    gt = json.loads(ground_truth) if isinstance(ground_truth, (str, bytes)) else ground_truth
    if not isinstance(gt, dict) or not gt:
        raise ValueError(f"knights_knaves ground truth must be a non-empty JSON object, got {ground_truth!r}")
    out = {}
    for name, role in gt.items():
        role = str(role).strip().lower()
        if role not in (KNIGHT, KNAVE):
            raise ValueError(f"knights_knaves ground truth role must be knight/knave, got {role!r} for {name!r}")
        out[str(name)] = role
    return out


def parse_answer(solution_str: Any, names: Iterable[str]) -> dict[str, set[str]] | None:
    """Roles stated per name after the last ``CONCLUSION:`` marker; None when there is no marker."""
    if isinstance(solution_str, bytes):
        solution_str = solution_str.decode("utf-8", errors="replace")
    if not isinstance(solution_str, str):
        return None
    last = None
    for last in MARKER_RE.finditer(solution_str):
        pass
    if last is None:
        return None
    section = solution_str[last.end():last.end() + _MAX_SECTION_CHARS]
    stated: dict[str, set[str]] = {}
    for name in names:
        pattern = rf"(?<!\w){re.escape(name)}\s+is\s+an?\s+(knight|knave)(?!\w)"
        stated[name] = {m.group(1).lower() for m in re.finditer(pattern, section, re.IGNORECASE)}
    return stated


def compute_score(data_source: Any = None, solution_str: Any = None, ground_truth: Any = None,
                  extra_info: Any = None, score: float = 1.0, format_score: float = 0.1, **kwargs: Any) -> float:
    """verl custom reward: ``compute_score(data_source=, solution_str=, ground_truth=, extra_info=, **kwargs)``.

    See the module docstring for the policy. ``data_source`` and ``extra_info`` are not needed (the ground truth
    carries the names); extra keyword arguments verl may pass (reward_router_address, ...) are ignored.
    """
    truth = parse_ground_truth(ground_truth)
    try:
        stated = parse_answer(solution_str, truth)
    except Exception:  # pragma: no cover - parse_answer is total on str; belt and braces for odd inputs
        return 0.0
    if stated is None:
        return 0.0
    if any(len(roles) != 1 for roles in stated.values()):
        return 0.0
    if all(stated[name] == {role} for name, role in truth.items()):
        return float(score)
    return float(format_score)
