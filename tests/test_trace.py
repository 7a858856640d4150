import json

import numpy as np
import pytest

from verl_infsample.core.trace import TraceError, read_trace, synth_trace, write_trace


def test_roundtrip_and_reproducible(tmp_path):
    a = synth_trace(5, 16, 512, "lognormal", seed=3)
    assert a == synth_trace(5, 16, 512, "lognormal", seed=3)
    assert a != synth_trace(5, 16, 512, "lognormal", seed=4)
    write_trace(a, tmp_path / "t.jsonl")
    assert read_trace(tmp_path / "t.jsonl") == a


def test_openings_roundtrip_and_stand_in_for_the_whole_tokens(tmp_path):
    from verl_infsample.core.trace import OPENING_TOKENS, TracePrompt

    long = tuple(range(1, OPENING_TOKENS + 1))
    a = [TracePrompt("p", 2, (3, 40), prompt_tokens=(7, 8), openings=((4, 5, 6), long), step=1)]
    write_trace(a, tmp_path / "t.jsonl")
    (b,) = read_trace(tmp_path / "t.jsonl")
    assert b == a[0] and b.opening(0) == (4, 5, 6) and b.opening(1) == long
    whole = TracePrompt("q", 1, (20,), tokens=(tuple(range(100, 120)),))
    assert whole.opening(0) == tuple(range(100, 100 + OPENING_TOKENS))
    assert TracePrompt("r", 1, (5,)).opening(0) == ()


def test_distributions_have_the_documented_shape():
    lognormal = synth_trace(400, 32, 4096, "lognormal", seed=0)
    medians = np.array([np.median(p.lengths) for p in lognormal])
    assert 180 < np.median(medians) < 340  # "a median length around 250 tokens"
    assert 0.45 < np.std(np.log(medians)) < 0.75  # log-sd 0.6 across prompts
    within = np.mean([np.std(np.log(p.lengths)) for p in lognormal])
    assert 0.35 < within < 0.55  # log-sd 0.45 within a group
    bimodal = synth_trace(200, 32, 1024, "bimodal", seed=0)
    runaway = np.mean([n == 1024 for p in bimodal for n in p.lengths])
    assert 0.10 < runaway < 0.16  # about 12% run to max-len
    assert max(max(p.lengths) for p in bimodal) == 1024


@pytest.mark.parametrize("line, message", [
    ('{"prompt_id": "a", "prompt_len": 3', "not JSON"),
    ('[1, 2]', "expected a JSON object"),
    ('{"prompt_len": 3, "lengths": [1]}', "missing field 'prompt_id'"),
    ('{"prompt_id": "a", "prompt_len": -1, "lengths": [1]}', "'prompt_len' must be an integer >= 0"),
    ('{"prompt_id": "a", "prompt_len": 3, "lengths": []}', "non-empty list"),
    ('{"prompt_id": "a", "prompt_len": 3, "lengths": [4, 0]}', r"'lengths'\[1\] must be an integer >= 1"),
    ('{"prompt_id": "a", "prompt_len": 3, "lengths": [4, 2.5]}', r"'lengths'\[1\]"),
    ('{"prompt_id": "a", "prompt_len": 3, "lengths": [4, 2], "openings": [[1, 2, 3, 4]]}', "one list per sample"),
    ('{"prompt_id": "a", "prompt_len": 3, "lengths": [4, 2], "openings": [[1, 2, 3, 4], [5]]}',
     r"'openings'\[1\] must be a list of min\(lengths\[1\], 16\) \(2\)"),
    ('{"prompt_id": "a", "prompt_len": 3, "lengths": [40], "openings": [[1, 2, 3]]}', r"\(16\) token ids"),
])
def test_malformed_lines_name_the_line_and_field(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    good = json.dumps({"prompt_id": "ok", "prompt_len": 1, "lengths": [1]})
    path.write_text(good + "\n" + line + "\n")
    with pytest.raises(TraceError, match=message) as info:
        read_trace(path)
    assert f"{path}:2" in str(info.value)


def test_duplicate_ids_and_empty_files(tmp_path):
    path = tmp_path / "dup.jsonl"
    line = json.dumps({"prompt_id": "x", "prompt_len": 1, "lengths": [1]})
    path.write_text(line + "\n" + line + "\n")
    with pytest.raises(TraceError, match="duplicate prompt_id 'x'"):
        read_trace(path)
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(TraceError, match="no prompts"):
        read_trace(tmp_path / "empty.jsonl")
    with pytest.raises(TraceError, match="cannot read"):
        read_trace(tmp_path / "missing.jsonl")


def test_odd_traces_are_read_or_refused_by_name_never_crash(tmp_path):
    """Fuzz: lines of a valid trace with fields replaced by odd JSON values (wrong types, huge or negative numbers,
    nesting, empty or long lists) are either read or refused with a TraceError naming the line: no other error."""
    import random

    from verl_infsample.core.trace import TracePrompt

    rng = random.Random(11)
    oddities = [None, True, -1, 0, 2 ** 70, 1.5, float("nan"), "x", "", [], {}, [[]], [None], [1, "a"], [-3],
                [[1, 2, 3]] * 3, list(range(40)), [[0] * 16, [1]], {"a": [1]}, [2 ** 64]]
    base = TracePrompt("p", 3, (4, 20), prompt_tokens=(1, 2, 3), openings=((5, 6, 7, 8), tuple(range(16))), step=2)
    write_trace([base], tmp_path / "base.jsonl")
    good = json.loads((tmp_path / "base.jsonl").read_text())
    keys = list(good) + ["tokens", "logprobs", "entropies", "stop_logprobs"]
    read = refused = 0
    for i in range(400):
        obj = dict(good)
        for key in rng.sample(keys, rng.randint(1, 3)):
            obj[key] = rng.choice(oddities)
        path = tmp_path / f"odd{i}.jsonl"
        path.write_text(json.dumps(obj) + "\n")
        try:
            read_trace(path)
            read += 1
        except TraceError as e:
            assert f"{path}:1" in str(e)
            refused += 1
    assert refused > 300 and read + refused == 400


# Unicode line breaks that str.splitlines honours and JSON Lines does not: real model output holds them raw.
LINE_BREAKS_INSIDE_TEXT = "\u2028\u2029\u0085\x1c\x1d\x1e\x0b\x0c"


def _groups_with_line_breaks(path):
    rows = [{"prompt_id": f"p{i}", "prompt": f"question{LINE_BREAKS_INSIDE_TEXT}{i}",
             "responses": [f"step one{c}step two {j} done" for j, c in enumerate(LINE_BREAKS_INSIDE_TEXT)]}
            for i in range(3)]
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return rows


def test_json_lines_end_at_a_line_feed_only(tmp_path):
    from verl_infsample.core.trace import json_lines

    path = tmp_path / "dump.jsonl"
    records = [{"input": "q\u2028r", "output": f"a{c}b", "step": 1} for c in LINE_BREAKS_INSIDE_TEXT]
    path.write_text("\r\n".join(json.dumps(r, ensure_ascii=False) for r in records) + "\r\n\n", encoding="utf-8")
    got = list(json_lines(path, "rows"))
    assert [obj for _, obj in got] == records
    assert [where for where, _ in got] == [f"{path}:{n}" for n in range(1, len(records) + 1)]
    path.write_bytes(b'{"a": "\xff"}\n')
    with pytest.raises(TraceError, match="not UTF-8"):
        list(json_lines(path, "rows"))


def test_trace_from_text_and_eval_drafter_read_text_with_unicode_line_breaks(tmp_path, capsys):
    from verl_infsample.cli import main

    groups = tmp_path / "g.jsonl"
    rows = _groups_with_line_breaks(groups)
    out = tmp_path / "t.jsonl"
    assert main(["trace", "from-text", "--groups", str(groups), "--tokenizer", "words", "--out", str(out)]) == 0
    trace = read_trace(out)
    assert [p.prompt_id for p in trace] == [r["prompt_id"] for r in rows]
    assert all(len(p.lengths) == len(LINE_BREAKS_INSIDE_TEXT) for p in trace)
    capsys.readouterr()
    assert main(["eval-drafter", "--groups", str(groups), "--tokenizer", "words", "--drafter", "ngram",
                 "--json"]) == 0
    (result,) = [json.loads(line) for line in capsys.readouterr().out.split("\n") if line.strip()]
    assert result["responses"] == 3 * len(LINE_BREAKS_INSIDE_TEXT)
