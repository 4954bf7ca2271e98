#!/usr/bin/python3
"""h2-export against PyTorch (docs/export.md).

Trains a tiny fp32 job with a [checkpoint] table on emulated chips
(h2-launch), exports its last checkpoint (h2-export), runs H2's own forward
pass on a fixed batch of token ids (h2-export --logits, test only), and
checks that a GPT written here from docs/export.md alone -- the names
mapped to nanoGPT's, the shapes and what the layers compute taken from the
config file -- gives the same logits: max |logits_py - logits_h2| <= 1e-5.

Usage (CTest runs it, tests/python/CMakeLists.txt):
  /usr/bin/python3 test_export.py --launch build/apps/h2-launch \
      --export build/apps/h2-export [--keep DIR]

Needs Debian's python3-torch and python3-numpy (make deps installs them);
without them it fails, saying so.
"""

import argparse
import json
import math
import pathlib
import re
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
    from safetensors_file import read_safetensors
except ImportError as e:
    sys.exit(f"test_export: FAIL: {sys.executable} cannot import {e.name}: "
             "install Debian's python3-torch and python3-numpy (make deps)")

TOLERANCE = 1e-5

# A tiny GPT on two emulated chips of two vendors, both in fp32, cut into
# two pipeline stages; a checkpoint every 2 steps (the last at step 4). The
# high learning rate grows the weights enough that the controls below
# (tanh GELU, a tied head) move the logits by more than the tolerance.
JOB = """\
[job]
name = "export-python"
seed = 11

[model]
vocab_size = 23
seq_len = 12
d_model = 24
n_head = 3
n_layer = 3
d_ff = 40

[data]
source = "markov"
entropy_rate = 1.0

[train]
steps = 4
global_batch = 4
micro_batch = 2
lr = 1e-1

[emulation]
clock = "virtual"

[[nodes]]
chips = [{{device = "emulated:h100-sxm", dtype = "fp32"}},
         {{device = "emulated:mi250x", dtype = "fp32"}}]

[plan]
mode = "manual"
schedule = "1f1b"
stages = ["0:0", "0:1"]
layers = [2, 3]

[checkpoint]
dir = "{checkpoints}"
every = 2
"""

# H2's names -> nanoGPT's (docs/export.md, "Names"). H2 numbers blocks by
# global layer (layer 0 is the embedding), so blockN is nanoGPT's h.(N-1).
BLOCK_NAMES = {
    "ln1": "ln_1", "attn.qkv": "attn.c_attn", "attn.proj": "attn.c_proj",
    "ln2": "ln_2", "mlp.fc1": "mlp.c_fc", "mlp.fc2": "mlp.c_proj",
}
OTHER_NAMES = {
    "embedding.wte": "transformer.wte.weight",
    "embedding.wpe": "transformer.wpe.weight",
    "head.ln_f.weight": "transformer.ln_f.weight",
    "head.ln_f.bias": "transformer.ln_f.bias",
    "head.lm_head.weight": "lm_head.weight",
}


def to_nanogpt(h2_state):
    """H2's exported state dict under nanoGPT's names (no transposes)."""
    out = {}
    for name, tensor in h2_state.items():
        m = re.fullmatch(r"block(\d+)\.(.+)\.(weight|bias)", name)
        if m:
            block, module, kind = int(m[1]), m[2], m[3]
            out[f"transformer.h.{block - 1}.{BLOCK_NAMES[module]}.{kind}"] = tensor
        else:
            out[OTHER_NAMES[name]] = tensor
    return out


def expected_shapes(cfg):
    """Every nanoGPT-named tensor's shape, from the config alone."""
    V, T, d, f = cfg["vocab_size"], cfg["seq_len"], cfg["d_model"], cfg["d_ff"]
    shapes = {"transformer.wte.weight": [V, d], "transformer.wpe.weight": [T, d],
              "transformer.ln_f.weight": [d], "transformer.ln_f.bias": [d],
              "lm_head.weight": [V, d]}
    for i in range(cfg["n_layer"]):
        p = f"transformer.h.{i}."
        shapes.update({
            p + "ln_1.weight": [d], p + "ln_1.bias": [d],
            p + "attn.c_attn.weight": [3 * d, d], p + "attn.c_attn.bias": [3 * d],
            p + "attn.c_proj.weight": [d, d], p + "attn.c_proj.bias": [d],
            p + "ln_2.weight": [d], p + "ln_2.bias": [d],
            p + "mlp.c_fc.weight": [f, d], p + "mlp.c_fc.bias": [f],
            p + "mlp.c_proj.weight": [d, f], p + "mlp.c_proj.bias": [d]})
    return shapes


def gpt_forward(sd, cfg, idx):
    """nanoGPT's forward (pre-LayerNorm blocks, causal attention, GELU MLP),
    untied: the LM head has its own weight. idx: [B, T] int64 -> logits."""
    B, T = idx.shape
    d, H = cfg["d_model"], cfg["n_head"]
    hd = d // H
    eps = cfg["layer_norm_eps"]

    def ln(x, prefix):
        return F.layer_norm(x, (d,), sd[prefix + ".weight"], sd[prefix + ".bias"], eps)

    def linear(x, prefix):
        return F.linear(x, sd[prefix + ".weight"], sd.get(prefix + ".bias"))

    x = sd["transformer.wte.weight"][idx] + sd["transformer.wpe.weight"][:T]
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    for i in range(cfg["n_layer"]):
        p = f"transformer.h.{i}."
        q, k, v = linear(ln(x, p + "ln_1"), p + "attn.c_attn").split(d, dim=2)
        q, k, v = (t.view(B, T, H, hd).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
        y = att.masked_fill(mask, float("-inf")).softmax(-1) @ v
        x = x + linear(y.transpose(1, 2).reshape(B, T, d), p + "attn.c_proj")
        h = F.gelu(linear(ln(x, p + "ln_2"), p + "mlp.c_fc"),
                   approximate=cfg["gelu_approximate"])
        x = x + linear(h, p + "mlp.c_proj")
    return linear(ln(x, "transformer.ln_f"), "lm_head")


def run(args, cwd):
    r = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True,
                       text=True, timeout=120)
    if r.returncode != 0:
        sys.exit(f"test_export: FAIL: {' '.join(map(str, args))} exited "
                 f"{r.returncode}:\n{r.stdout}{r.stderr}")
    return r.stdout


def check(condition, what):
    if not condition:
        sys.exit(f"test_export: FAIL: {what}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--launch", required=True)
    parser.add_argument("--export", required=True)
    parser.add_argument("--keep", help="work in DIR and keep the files")
    a = parser.parse_args()
    a.launch, a.export = (pathlib.Path(p).resolve() for p in (a.launch, a.export))
    torch.set_num_threads(1)
    if a.keep:
        pathlib.Path(a.keep).mkdir(parents=True, exist_ok=True)
        work(a, pathlib.Path(a.keep).resolve())
    else:
        with tempfile.TemporaryDirectory(prefix="h2-export-test-") as d:
            work(a, pathlib.Path(d))


def work(a, tmp):
    job = tmp / "job.toml"
    job.write_text(JOB.format(checkpoints=tmp / "checkpoints"))
    run([a.launch, job, "-q", "--no-metrics"], tmp)
    checkpoint = tmp / "checkpoints" / "step-00000004"
    check((checkpoint / "manifest.json").exists(), f"no checkpoint {checkpoint}")

    out = tmp / "model.safetensors"
    print(run([a.export, checkpoint, out], tmp), end="")
    cfg = json.loads((tmp / "model.config.json").read_text())
    h2_state, metadata = read_safetensors(out)

    # The config says what the file holds and what the model computes.
    check(cfg["format"] == "h2-export" and cfg["format_version"] == 1, cfg)
    check(cfg["weights"] == out.name, f"config names weights {cfg['weights']}")
    check(cfg["step"] == 4, f"config step {cfg['step']}, checkpoint step 4")
    check(cfg["tied_embeddings"] is False, "H2's embeddings are untied")
    check(cfg["bias"] is True and cfg["lm_head_bias"] is False, "biases")
    check(cfg["norm"] == "pre" and cfg["activation"] == "gelu"
          and cfg["attention"] == "causal"
          and cfg["position_embedding"] == "learned", cfg)
    check(cfg["head_dim"] * cfg["n_head"] == cfg["d_model"], "head_dim")
    check(metadata.get("producer") == "h2", f"metadata {metadata}")
    check(metadata.get("job") == cfg["job"], f"metadata {metadata}")
    dtype = {"float32": torch.float32}[cfg["dtype"]]

    sd = to_nanogpt(h2_state)
    shapes = expected_shapes(cfg)
    check(sorted(sd) == sorted(shapes),
          f"names {sorted(set(sd) ^ set(shapes))} differ from docs/export.md")
    for name, tensor in sd.items():
        check(list(tensor.shape) == shapes[name] and tensor.dtype == dtype,
              f"{name}: {list(tensor.shape)} {tensor.dtype}, config says "
              f"{shapes[name]} {dtype}")
    check(sum(t.numel() for t in sd.values()) == cfg["parameters"], "count")
    check(not torch.equal(sd["lm_head.weight"], sd["transformer.wte.weight"]),
          "lm_head.weight equals wte: untied embeddings should differ")

    # A fixed batch of token ids, int32 little-endian [batch, seq_len].
    batch = 3
    rng = np.random.default_rng(20240611)
    tokens = rng.integers(0, cfg["vocab_size"], size=(batch, cfg["seq_len"]),
                          dtype=np.int32)
    tokens_file, logits_file = tmp / "tokens.bin", tmp / "logits.bin"
    tokens.astype("<i4").tofile(tokens_file)
    print(run([a.export, checkpoint, "--logits", tokens_file, logits_file], tmp),
          end="")
    shape = (batch, cfg["seq_len"], cfg["vocab_size"])
    raw = np.fromfile(logits_file, dtype="<f4")
    check(raw.size == math.prod(shape), f"{raw.size} logits, expected {shape}")
    logits_h2 = torch.from_numpy(raw.reshape(shape))

    with torch.no_grad():
        logits_py = gpt_forward(sd, cfg, torch.from_numpy(tokens).long())
    diff = (logits_py - logits_h2).abs().max().item()
    print(f"test_export: max |logits_py - logits_h2| = {diff:.3e} "
          f"over {list(shape)} logits (tolerance {TOLERANCE:g})")
    check(diff <= TOLERANCE, f"max difference {diff:.3e} > {TOLERANCE:g}")

    # Controls: the comparison sees what the config states.
    tied = dict(sd, **{"lm_head.weight": sd["transformer.wte.weight"]})
    controls = {"tanh GELU": (sd, dict(cfg, gelu_approximate="tanh")),
                "lm_head tied to wte": (tied, cfg)}
    for what, (control_sd, control_cfg) in controls.items():
        with torch.no_grad():
            logits = gpt_forward(control_sd, control_cfg,
                                 torch.from_numpy(tokens).long())
        control = (logits - logits_h2).abs().max().item()
        print(f"test_export: control, {what}: max difference {control:.3e}")
        check(control > TOLERANCE, f"the comparison cannot tell {what} from "
              "H2's model: make the weights larger (train.lr)")
    print("test_export: PASS")


if __name__ == "__main__":
    main()
