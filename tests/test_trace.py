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
    ('{"prompt_id": "a", "prompt_len": 3', "not valid JSON"),
    ('[1, 2]', "expected a JSON object"),
    ('{"prompt_len": 3, "lengths": [1]}', "missing field 'prompt_id'"),
    ('{"prompt_id": "a", "prompt_len": -1, "lengths": [1]}', "'prompt_len' must be an integer >= 0"),
    ('{"prompt_id": "a", "prompt_len": 3, "lengths": []}', "non-empty list"),
    ('{"prompt_id": "a", "prompt_len": 3, "lengths": [4, 0]}', r"'lengths'\[1\] must be an integer >= 1"),
    ('{"prompt_id": "a", "prompt_len": 3, "lengths": [4, 2.5]}', r"'lengths'\[1\]"),
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
