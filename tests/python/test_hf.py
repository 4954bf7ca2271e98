#!/usr/bin/python3
"""Real models on real text against their Python references (docs/data.md,
docs/export.md, "Hugging Face").

1. h2-data tokenize on fortunes: the shards hold exactly the ids
   python3-sentencepiece gives for the same model and text (each line with
   its line break, then </s> after each file), and decode to the text.
2. For the llama and the gpt2 family: a job trains on those shards on two
   emulated chips of two vendors (h2-launch), h2-export --format hf writes
   a Hugging Face directory, and a forward pass written here from Hugging
   Face's modelling code (LlamaForCausalLM, GPT2LMHeadModel; transformers
   itself is not packaged in Debian) on config.json and model.safetensors
   gives H2's own logits (h2-export --logits) within 1e-4 in fp32. Controls
   show the comparison would see another RoPE layout or a tied head.
3. h2-launch --init-from the exported directory trains.

Usage (CTest runs it, tests/python/CMakeLists.txt):
  /usr/bin/python3 test_hf.py --bin build/apps [--keep DIR]
"""

import argparse
import json
import math
import pathlib
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import sentencepiece as spm
    import torch
    import torch.nn.functional as F
    from safetensors_file import read_safetensors
except ImportError as e:
    sys.exit(f"test_hf: FAIL: {sys.executable} cannot import {e.name}: "
             "install Debian's python3-torch, python3-numpy and "
             "python3-sentencepiece (make deps)")

TOLERANCE = 1e-4
TEXTS = ["/usr/share/games/fortunes/food", "/usr/share/games/fortunes/kids"]

MODELS = {
    "llama": """family = "llama"
d_model = 32
n_head = 4
n_kv_head = 2
n_layer = 3
d_ff = 48
rope_theta = 500.0
norm_eps = 1e-6""",
    "gpt2": """d_model = 32
n_head = 4
n_layer = 3
d_ff = 48""",
}

JOB = """\
[job]
name = "hf-{family}"
seed = 3
[model]
vocab_size = 512
seq_len = 32
{model}
[data]
source = "shards"
shards = "{shards}"
[train]
steps = 4
global_batch = 4
micro_batch = 2
lr = 5e-2
[emulation]
clock = "virtual"
[[nodes]]
chips = [{{device = "emulated:h100-sxm", dtype = "fp32"}},
         {{device = "emulated:mi300x", dtype = "fp32"}}]
[plan]
mode = "manual"
stages = ["0:0", "0:1"]
layers = [2, 3]
[checkpoint]
dir = "{checkpoints}"
every = 4
"""


def run(args, cwd):
    r = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True,
                       text=True, timeout=300)
    if r.returncode != 0:
        sys.exit(f"test_hf: FAIL: {' '.join(map(str, args))} exited "
                 f"{r.returncode}:\n{r.stdout}{r.stderr}")
    return r.stdout


def check(condition, what):
    if not condition:
        sys.exit(f"test_hf: FAIL: {what}")


# --- Hugging Face's LlamaForCausalLM, from its modelling code --------------

def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rotate_interleaved(x):
    # Meta's original layout (pairs 2i, 2i+1): a control, not what H2 does.
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def llama_forward(sd, cfg, idx, rotate=rotate_half):
    B, T = idx.shape
    d, H = cfg["hidden_size"], cfg["num_attention_heads"]
    KV, hd = cfg["num_key_value_heads"], cfg["head_dim"]
    eps = cfg["rms_norm_eps"]

    def rms(x, w):
        v = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
        return w * (x * torch.rsqrt(v + eps))

    inv_freq = 1.0 / (cfg["rope_theta"] ** (
        torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    freqs = torch.outer(torch.arange(T).float(), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    x = sd["model.embed_tokens.weight"][idx]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms(x, sd[p + "input_layernorm.weight"])
        q = F.linear(h, sd[p + "self_attn.q_proj.weight"]).view(B, T, H, hd).transpose(1, 2)
        k = F.linear(h, sd[p + "self_attn.k_proj.weight"]).view(B, T, KV, hd).transpose(1, 2)
        v = F.linear(h, sd[p + "self_attn.v_proj.weight"]).view(B, T, KV, hd).transpose(1, 2)
        q = q * cos + rotate(q) * sin
        k = k * cos + rotate(k) * sin
        k = k[:, :, None].expand(B, KV, H // KV, T, hd).reshape(B, H, T, hd)
        v = v[:, :, None].expand(B, KV, H // KV, T, hd).reshape(B, H, T, hd)
        att = (q @ k.transpose(2, 3)) / math.sqrt(hd)
        att = att.masked_fill(mask, float("-inf")).softmax(-1, dtype=torch.float32)
        y = (att @ v).transpose(1, 2).reshape(B, T, d)
        x = x + F.linear(y, sd[p + "self_attn.o_proj.weight"])
        h = rms(x, sd[p + "post_attention_layernorm.weight"])
        gate = F.linear(h, sd[p + "mlp.gate_proj.weight"])
        up = F.linear(h, sd[p + "mlp.up_proj.weight"])
        x = x + F.linear(F.silu(gate) * up, sd[p + "mlp.down_proj.weight"])
    return F.linear(rms(x, sd["model.norm.weight"]), sd["lm_head.weight"])


# --- Hugging Face's GPT2LMHeadModel ----------------------------------------

def gpt2_forward(sd, cfg, idx):
    B, T = idx.shape
    d, H = cfg["n_embd"], cfg["n_head"]
    hd, eps = d // H, cfg["layer_norm_epsilon"]

    def ln(x, p):
        return F.layer_norm(x, (d,), sd[p + ".weight"], sd[p + ".bias"], eps)

    def conv1d(x, p):  # HF's Conv1D: x @ W + b, W stored [in, out]
        return x @ sd[p + ".weight"] + sd[p + ".bias"]

    x = sd["transformer.wte.weight"][idx] + sd["transformer.wpe.weight"][:T]
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    for i in range(cfg["n_layer"]):
        p = f"transformer.h.{i}."
        q, k, v = conv1d(ln(x, p + "ln_1"), p + "attn.c_attn").split(d, dim=2)
        q, k, v = (t.view(B, T, H, hd).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
        y = att.masked_fill(mask, float("-inf")).softmax(-1) @ v
        x = x + conv1d(y.transpose(1, 2).reshape(B, T, d), p + "attn.c_proj")
        x = x + conv1d(F.gelu(conv1d(ln(x, p + "ln_2"), p + "mlp.c_fc")),
                       p + "mlp.c_proj")
    return F.linear(ln(x, "transformer.ln_f"), sd["lm_head.weight"])


def check_tokens(a, tmp):
    shards = tmp / "shards"
    run([a.bin / "h2-data", "tokenize", "-q", "--vocab-size", "512",
         "--out", shards, "--input", *TEXTS], tmp)
    manifest = json.loads((shards / "manifest.json").read_text())
    sp = spm.SentencePieceProcessor(model_file=str(shards / "tokenizer.model"))
    ids = np.concatenate([np.fromfile(shards / s["file"], dtype="<u4")
                          for s in manifest["shards"]]).tolist()
    expected = []
    for path in TEXTS:
        text = pathlib.Path(path).read_text(encoding="utf-8")
        ours = []
        for line in text.splitlines(keepends=True):
            ours += sp.encode(line)
        check(sp.decode(ours) == text, f"{path} does not round-trip")
        expected += ours + [sp.eos_id()]
    check(ids == expected, "h2-data's ids differ from python3-sentencepiece's "
          f"({len(ids)} against {len(expected)} ids)")
    print(f"test_hf: {len(ids)} ids of h2-data equal python3-sentencepiece's")
    return shards


def check_family(a, tmp, family, shards):
    work = tmp / family
    work.mkdir()
    job = work / "job.toml"
    job.write_text(JOB.format(family=family, model=MODELS[family],
                              shards=shards, checkpoints=work / "ckpt"))
    run([a.bin / "h2-launch", job, "-q", "--no-metrics"], work)
    checkpoint = work / "ckpt" / "step-00000004"
    hf = work / "hf"
    print(run([a.bin / "h2-export", "--format", "hf", checkpoint, hf], work),
          end="")
    cfg = json.loads((hf / "config.json").read_text())
    sd, _ = read_safetensors(hf / "model.safetensors")
    check((hf / "tokenizer.model").read_bytes()
          == (shards / "tokenizer.model").read_bytes(), "tokenizer copied")
    check(cfg["architectures"] == [{"llama": "LlamaForCausalLM",
                                    "gpt2": "GPT2LMHeadModel"}[family]], cfg)

    batch, T = 3, 32
    rng = np.random.default_rng(7)
    tokens = rng.integers(0, 512, size=(batch, T), dtype=np.int32)
    tokens.astype("<i4").tofile(work / "tokens.bin")
    run([a.bin / "h2-export", checkpoint, "--logits", work / "tokens.bin",
         work / "logits.bin"], work)
    h2 = torch.from_numpy(
        np.fromfile(work / "logits.bin", dtype="<f4").reshape(batch, T, 512))
    idx = torch.from_numpy(tokens).long()
    forward = llama_forward if family == "llama" else gpt2_forward
    with torch.no_grad():
        diff = (forward(sd, cfg, idx) - h2).abs().max().item()
        # Controls: Meta's interleaved RoPE; GPT-2's tied head (its default).
        if family == "llama":
            wrong = forward(sd, cfg, idx, rotate=rotate_interleaved)
        else:
            tied = dict(sd, **{"lm_head.weight": sd["transformer.wte.weight"]})
            wrong = forward(tied, cfg, idx)
        control = (wrong - h2).abs().max().item()
    print(f"test_hf: {family}: max |logits_hf - logits_h2| = {diff:.3e} "
          f"(tolerance {TOLERANCE:g}); control {control:.3e}")
    check(diff <= TOLERANCE, f"{family}: difference {diff:.3e} > {TOLERANCE}")
    check(control > TOLERANCE, f"{family}: the control is within tolerance")

    out = run([a.bin / "h2-launch", job, "--init-from", hf, "--no-metrics",
               "--steps", "1"], work)
    check("h2: starting from" in out, f"--init-from: {out}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", required=True, help="build/apps")
    parser.add_argument("--keep", help="work in DIR and keep the files")
    a = parser.parse_args()
    a.bin = pathlib.Path(a.bin).resolve()
    torch.set_num_threads(1)
    if a.keep:
        tmp = pathlib.Path(a.keep).resolve()
        tmp.mkdir(parents=True, exist_ok=True)
        go(a, tmp)
    else:
        with tempfile.TemporaryDirectory(prefix="h2-hf-test-") as d:
            go(a, pathlib.Path(d))


def go(a, tmp):
    shards = check_tokens(a, tmp)
    for family in ("llama", "gpt2"):
        check_family(a, tmp, family, shards)
    print("test_hf: PASS")


if __name__ == "__main__":
    main()
