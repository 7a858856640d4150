"""The tiny offline model: a real Qwen3 checkpoint folder, loadable offline, with prompt-dependent response lengths.

The default model is built once per session into a temporary folder (about half a minute on one CPU thread); the
other builds here are small (a few training steps) and take a second or two each.
"""

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys

import pytest

# Nothing here may touch the network: set before transformers / huggingface_hub are first imported.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from infsample_lab.models import tiny, tiny_build, tiny_recipe, tiny_train  # noqa: E402

MAX_NEW = 128
SMALL = dict(train_steps=3, corpus_size=300)  # quick builds for the properties that do not need a trained model


@pytest.fixture(scope="session")
def model_dir(tiny_model_dir):
    """The default build, as ``tiny_model_path`` caches it (the same parameters and weights a fresh
    ``build_tiny_model`` gives: the fingerprint covers them), built once for the whole suite."""
    from pathlib import Path

    return Path(tiny_model_dir)


@pytest.fixture(scope="session")
def tok(model_dir):
    return transformers.AutoTokenizer.from_pretrained(model_dir, local_files_only=True)


@pytest.fixture(scope="session")
def model(model_dir):
    return transformers.AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True).eval()


def _ids(encoded):
    """apply_chat_template(tokenize=True) gives a BatchEncoding in transformers 5, a list of ids in 4."""
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


def test_folder_is_a_plain_hf_checkpoint(model_dir, model, tok):
    for name in ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
                 "tokenizer_config.json", tiny.STAMP_FILE):
        assert (model_dir / name).is_file(), name
    assert type(model).__name__ == "Qwen3ForCausalLM"
    cfg = transformers.AutoConfig.from_pretrained(model_dir, local_files_only=True)
    assert isinstance(cfg, transformers.Qwen3Config) and cfg.model_type == "qwen3"
    assert cfg.head_dim == 64
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads) == (2, 128, 2, 1)
    assert cfg.vocab_size == len(tok) == model.get_input_embeddings().weight.shape[0]
    assert model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()


def test_special_tokens_consistent(model_dir, model, tok):
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert tok.eos_token_id is not None and tok.pad_token_id is not None and tok.eos_token_id != tok.pad_token_id
    assert {tok.eos_token_id, tok.pad_token_id} <= set(tok.all_special_ids)
    assert tok.convert_tokens_to_ids("<|im_start|>") in tok.all_special_ids
    assert len({tok.eos_token_id, tok.pad_token_id, tok.convert_tokens_to_ids("<|im_start|>")}) == 3
    assert model.config.eos_token_id == tok.eos_token_id and model.config.pad_token_id == tok.pad_token_id
    gen = transformers.GenerationConfig.from_pretrained(model_dir, local_files_only=True)
    assert gen.eos_token_id == tok.eos_token_id and gen.pad_token_id == tok.pad_token_id
    # The special tokens are single ids inside text, and byte-level BPE round-trips anything.
    text = "<|im_start|>user\ncount to 7, then say héllo!<|im_end|>\n"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids.count(tok.convert_tokens_to_ids("<|im_start|>")) == 1 and ids.count(tok.eos_token_id) == 1
    assert tok.decode(ids) == text
    assert tok.decode(ids, skip_special_tokens=True) == "user\ncount to 7, then say héllo!\n"


def test_chat_template(tok):
    msgs = [{"role": "user", "content": "count to 7"}]
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>user\ncount to 7<|im_end|>\n<|im_start|>assistant\n"
    assert tok.apply_chat_template(msgs, tokenize=False) == "<|im_start|>user\ncount to 7<|im_end|>\n"
    ids = _ids(tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True))
    assert ids == tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids).endswith("<|im_start|>assistant\n")
    two = [{"role": "system", "content": "be brief"}, *msgs, {"role": "assistant", "content": "1 2 3"}]
    assert tok.apply_chat_template(two, tokenize=False).count("<|im_end|>\n") == 3
    assert tiny.render_chat("count to 7") == text


def test_greedy_generate_is_deterministic(model, tok):
    enc = tok.apply_chat_template([{"role": "user", "content": "count down from 12"}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)
    runs = [model.generate(**enc, do_sample=False, max_new_tokens=24, pad_token_id=tok.pad_token_id) for _ in "ab"]
    assert torch.equal(runs[0], runs[1])
    ids = enc["input_ids"]  # and it is the model's own argmax, token by token
    for _ in range(runs[0].shape[1] - ids.shape[1]):
        ids = torch.cat([ids, model(input_ids=ids).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(ids, runs[0])


def test_lean_training_forward_matches_hf(model):
    # Training uses a wrapper-free forward; it must be exactly the model transformers (and engines) will run.
    ids = torch.randint(0, model.config.vocab_size, (2, 40), generator=torch.Generator().manual_seed(0))
    cos, sin = tiny_train._rope_tables(model, 64)
    with torch.no_grad():
        lean = tiny_train._lean_hidden(model, ids, cos, sin)
        ref = model.model(input_ids=ids).last_hidden_state
    torch.testing.assert_close(lean, ref, rtol=1e-5, atol=1e-5)


def test_shared_prefix_training_forward_matches_whole_rows(model):
    # Rows that share a long prefix (the "tools" corpus's system turn) train on its keys and values, computed once.
    g = torch.Generator().manual_seed(1)
    prefix, suffix = torch.randint(0, model.config.vocab_size, (1, 70), generator=g), torch.randint(
        0, model.config.vocab_size, (3, 20), generator=g)
    cos, sin = tiny_train._rope_tables(model, 96)
    with torch.no_grad():
        whole = tiny_train._lean_hidden(model, torch.cat([prefix.expand(3, -1), suffix], dim=1), cos, sin)[:, 70:]
        shared = tiny_train._lean_hidden_shared_prefix(model, prefix, suffix, cos, sin)
    torch.testing.assert_close(shared, whole, rtol=1e-5, atol=1e-5)
    rows = [([1, 2, 3, 4, 5], [False] * 3 + [True] * 2), ([1, 2, 3, 9, 5, 6], [False] * 4 + [True] * 2)]
    assert tiny_train._shared_prefix(rows) == 2  # stops before the token the first learnt one is predicted from


def test_sampled_lengths_spread(model_dir, model, tok):
    prompts = tiny.default_prompts(16)
    responses = tiny.sample_responses(model_dir, [prompts[i % 16] for i in range(32)], max_new_tokens=MAX_NEW,
                                      seed=0, model=model, tokenizer=tok)
    lengths = [len(r) for r in responses]
    stopped = [r for r in responses if r[-1] == tok.eos_token_id]
    assert all(1 <= n <= MAX_NEW for n in lengths)
    assert all(len(r) == MAX_NEW and tok.eos_token_id not in r for r in responses if r[-1] != tok.eos_token_id)
    assert len(set(lengths)) >= 5, lengths
    assert len(stopped) >= len(responses) // 4, lengths  # many stop on eos before the cap ...
    assert any(n >= 48 for n in lengths), lengths  # ... and some run long
    assert min(lengths) < 16, lengths
    # Sampling is seeded: the same call gives the same lengths.
    again = tiny.length_histogram(model_dir, prompts[:4], n=8, seed=5, model=model, tokenizer=tok)
    assert again == tiny.length_histogram(model_dir, prompts[:4], n=8, seed=5, model=model, tokenizer=tok)


def test_length_depends_on_prompt(model_dir, model, tok):
    short = ["say cat", "is 5 bigger than 200", "list the letters of dog", "tell a tiny story about moon"]
    long = ["count to 250", "tell a endless story about moon", "repeat tree 200 times", "count from 20 to 190"]
    kw = dict(n=24, max_new_tokens=64, seed=1, model=model, tokenizer=tok)
    ls, ll = tiny.length_histogram(model_dir, short, **kw), tiny.length_histogram(model_dir, long, **kw)
    assert statistics.mean(ls) * 2 < statistics.mean(ll), (ls, ll)


def test_eos_bias_shifts_lengths(model_dir, model, tok):
    prompts = tiny.default_prompts(8)
    kw = dict(n=24, max_new_tokens=64, seed=2, model=model, tokenizer=tok)
    mean = {b: statistics.mean(tiny.length_histogram(model_dir, prompts, eos_bias=b, **kw)) for b in (-3.0, 0, 3.0)}
    assert mean[3.0] < mean[0] < mean[-3.0], mean
    proc = tiny.eos_bias_processor(tok.eos_token_id, 2.5)
    scores = torch.zeros(2, len(tok))
    out = proc(None, scores)
    assert out[:, tok.eos_token_id].tolist() == [2.5, 2.5] and out.sum().item() == 5.0 and scores.sum().item() == 0
    proc.bias = 0.0  # the knob can move between calls
    assert proc(None, scores).sum().item() == 0


def test_same_seed_same_weights(tmp_path):
    from safetensors.torch import load_file

    a = tiny.build_tiny_model(tmp_path / "a", seed=3, **SMALL)
    b = tiny.build_tiny_model(tmp_path / "b", seed=3, **SMALL)
    c = tiny.build_tiny_model(tmp_path / "c", seed=4, **SMALL)
    wa, wb, wc = (load_file(d / "model.safetensors") for d in (a, b, c))
    assert wa.keys() == wb.keys() and len(wa) > 10
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    assert not torch.equal(wa["model.embed_tokens.weight"], wc["model.embed_tokens.weight"])
    assert (a / "tokenizer.json").read_bytes() == (b / "tokenizer.json").read_bytes()
    sa, sb = (json.loads((d / tiny.STAMP_FILE).read_text()) for d in (a, b))
    assert sa["fingerprint"] == sb["fingerprint"] == tiny.fingerprint(dict(seed=3, **SMALL))
    # the stamp names the weights themselves (the same recipe on another CPU's float kernels may train others)
    assert sa["weights_sha256"] == sb["weights_sha256"] == hashlib.sha256((a / "model.safetensors").read_bytes()
                                                                          ).hexdigest()
    assert json.loads((c / tiny.STAMP_FILE).read_text())["weights_sha256"] != sa["weights_sha256"]
    # Rebuilding over an earlier build is allowed; over a foreign folder is not.
    tiny.build_tiny_model(a, seed=3, **SMALL)
    assert torch.equal(load_file(a / "model.safetensors")["model.embed_tokens.weight"], wa["model.embed_tokens.weight"])
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="refusing"):
        tiny.build_tiny_model(tmp_path / "foreign", **SMALL)


def test_cli_handler(tmp_path, capsys):
    parser = argparse.ArgumentParser(prog="infsample")
    tiny.add_make_tiny_model_parser(parser.add_subparsers(dest="command", required=True))
    out = tmp_path / "cli-model"
    args = parser.parse_args(["make-tiny-model", str(out), "--layers", "1", "--hidden", "64", "--heads", "2",
                              "--kv-heads", "2", "--vocab", "512", "--seed", "7", "--train-steps", "3"])
    assert args.func is tiny.cmd_make_tiny_model
    assert tiny.cmd_make_tiny_model(args) == 0
    assert capsys.readouterr().out.strip() == str(out)
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
            cfg["head_dim"]) == (1, 64, 2, 2, 64)
    assert cfg["vocab_size"] <= 512
    m = transformers.AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    t = transformers.AutoTokenizer.from_pretrained(out, local_files_only=True)
    enc = t.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, return_tensors="pt",
                                return_dict=True)
    assert m.generate(**enc, max_new_tokens=4, do_sample=False, pad_token_id=t.pad_token_id).shape[1] > \
        enc["input_ids"].shape[1]  # the built folder loads and decodes
    # a variant's own step count (modes: MODES_TRAIN_STEPS) is its default; --train-steps overrides it
    modes = parser.parse_args(["make-tiny-model", str(tmp_path / "modes"), "--layers", "1", "--hidden", "64",
                               "--heads", "2", "--kv-heads", "2", "--vocab", "512", "--variant", "modes",
                               "--train-steps", "2"])
    assert tiny.cmd_make_tiny_model(modes) == 0
    stamp = json.loads((tmp_path / "modes" / tiny.STAMP_FILE).read_text())
    assert (stamp["params"]["corpus"], stamp["params"]["train_steps"]) == ("modes", 2)
    # a variant's own parameters are its defaults (tools: 4 heads), flags given override them (1 layer)
    tools = parser.parse_args(["make-tiny-model", str(tmp_path / "tools"), "--variant", "tools", "--layers", "1",
                               "--train-steps", "2"])
    assert tiny.cmd_make_tiny_model(tools) == 0
    cfg = json.loads((tmp_path / "tools" / "config.json").read_text())
    assert (cfg["num_hidden_layers"], cfg["num_attention_heads"]) == (1, tiny_recipe.VARIANTS["tools"]["heads"])
    bad = parser.parse_args(["make-tiny-model", str(tmp_path / "bad"), "--heads", "2", "--kv-heads", "3"])
    with pytest.raises(ValueError, match="kv_heads"):
        tiny.cmd_make_tiny_model(bad)


def test_tiny_model_path_caches_by_fingerprint(tmp_path, monkeypatch):
    monkeypatch.setattr(tiny_recipe, "DEFAULTS", {**tiny_recipe.DEFAULTS, **SMALL})
    calls = []
    real_build = tiny_build.build_tiny_model
    monkeypatch.setattr(tiny_build, "build_tiny_model", lambda out, **kw: calls.append(out) or real_build(out, **kw))

    p1 = tiny.tiny_model_path(tmp_path)
    assert p1.parent == tmp_path and p1.name.endswith(tiny.fingerprint()[:12])
    assert len(calls) == 1 and calls[0] != p1  # built elsewhere, renamed into place
    assert tiny.tiny_model_path(tmp_path) == p1 and len(calls) == 1  # cached
    assert [d.name for d in tmp_path.iterdir() if d.name != ".build-lock"] == [p1.name]  # no half-built leftovers

    (p1 / tiny.STAMP_FILE).unlink()  # a broken folder is rebuilt, not used
    assert tiny.tiny_model_path(tmp_path) == p1 and len(calls) == 2 and (p1 / tiny.STAMP_FILE).is_file()

    monkeypatch.setattr(tiny_recipe, "DEFAULTS", {**tiny_recipe.DEFAULTS, "seed": 1})  # new defaults: a new model
    p2 = tiny.tiny_model_path(tmp_path)
    assert p2 != p1 and len(calls) == 3 and p1.is_dir()

    import threading  # callers at once (test workers): one builds, the others wait and use it
    monkeypatch.setattr(tiny_recipe, "DEFAULTS", {**tiny_recipe.DEFAULTS, "seed": 2})
    paths = []
    workers = [threading.Thread(target=lambda: paths.append(tiny.tiny_model_path(tmp_path))) for _ in range(3)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert len(set(paths)) == 1 and len(paths) == 3 and len(calls) == 4


def test_histogram_plot(tmp_path):
    pytest.importorskip("matplotlib")
    path = tiny.plot_length_histogram([2, 5, 5, 40, 77, 128, 128], tmp_path / "h.png", max_new_tokens=128)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_import_is_light_and_core_does_not_import_it():
    code = ("import sys, infsample_lab.models.tiny, verl_infsample.core.scheduler, verl_infsample.cli; "
            "print(sorted(m for m in ('torch', 'transformers', 'tokenizers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    code = "import sys, verl_infsample.core, verl_infsample.cli; print('infsample_lab.models.tiny' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
