"""PyTorch's figures for the two GPU targets, on the same GPU, as the peer
baseline of docs/benchmarks.md:

- batch-1 bf16 GEMVs of the 7B Llama shapes (F.linear, cuBLAS), each timed
  after an L2-flushing write as decode sees them, in GB/s of weights read;
- GPT-2-1.5B training (HuggingFace transformers, bf16 autocast, fused AdamW,
  SDPA attention), tokens/s and MFU against the same 6N + attention FLOPs
  that `corolla bench train` counts.

    python3 scripts/gpu/torch_reference.py   # prints one JSON line last
"""
import json
import time

import torch
import torch.nn.functional as F

dev = "cuda"
result = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}

# GEMVs of the 7B Llama shapes (in -> out), qkv and gate+up fused as corolla does.
flush = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
gemv = []
for k, n in [(4096, 12288), (4096, 4096), (4096, 22016), (11008, 4096), (4096, 32000)]:
    w = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
    x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
    for _ in range(3):
        F.linear(x, w)
    best = 1e30
    for _ in range(10):
        flush.fill_(1)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        F.linear(x, w)
        b.record()
        torch.cuda.synchronize()
        best = min(best, a.elapsed_time(b) * 1000.0)
    gbps = n * k * 2 / (best * 1e-6) / 1e9
    gemv.append({"in": k, "out": n, "microseconds": best, "gbps": gbps})
    print(f"torch GEMV {k:6d} -> {n:6d}  {best:7.1f} us  {gbps:7.0f} GB/s", flush=True)
    del w
result["gemv"] = gemv
del flush

# GPT-2-1.5B training, B=4 T=1024.
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

cfg = GPT2Config(n_embd=1600, n_layer=48, n_head=25, n_positions=1024, vocab_size=50257)
try:
    cfg._attn_implementation = "sdpa"
except Exception:
    pass
with torch.device(dev):  # initialised on the GPU: on the host it takes longer than the run
    model = GPT2LMHeadModel(cfg)
model.train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
B, T = 4, 1024
ids = torch.randint(0, cfg.vocab_size, (B, T), device=dev)


def step():
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


for _ in range(2):
    step()
torch.cuda.synchronize()
steps = 5
t0 = time.perf_counter()
for _ in range(steps):
    step()
torch.cuda.synchronize()
sec = (time.perf_counter() - t0) / steps
n_params = sum(p.numel() for p in model.parameters())
# As apps/bench.cpp counts: 6 x (block matrices + the head) + 6 L T d for attention.
matrix_params = 12 * cfg.n_layer * cfg.n_embd ** 2 + cfg.vocab_size * cfg.n_embd
flops_per_token = 6 * matrix_params + 6 * cfg.n_layer * T * cfg.n_embd
tps = B * T / sec
result["train"] = {"params": n_params, "batch": B, "seq": T, "step_seconds": sec, "tokens_per_s": tps,
                   "achieved_gflops": tps * flops_per_token / 1e9}
print(f"torch GPT-2-1.5B train  {tps:9.1f} tokens/s  {tps * flops_per_token / 1e12:6.1f} TFLOP/s", flush=True)
print(json.dumps(result))
