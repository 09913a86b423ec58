"""Greedy generation of random tiny Llama and GPT-2 models: HuggingFace
transformers (PyTorch, f32) against `corolla generate` on the cpu and on the
GPU (f32), token for token. Exits 1 on any difference.

    python3 scripts/gpu/hf_reference.py WORK_DIR
"""
import subprocess
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

work = sys.argv[1]
prompt = [3, 17, 42, 99, 7, 200, 150, 11]
torch.manual_seed(0)
models = {
    "llama": LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=352,
                                          num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
                                          max_position_embeddings=256, initializer_range=0.2,
                                          tie_word_embeddings=False)),
    "gpt2": GPT2LMHeadModel(GPT2Config(vocab_size=256, n_embd=128, n_layer=4, n_head=8, n_positions=256,
                                       initializer_range=0.2)),
}
failed = False
for name, model in models.items():
    model = model.float().eval()
    model.save_pretrained(f"{work}/{name}", safe_serialization=True)
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=48, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
    want = out[0, len(prompt):].tolist()
    for device in ("cpu", "cuda"):
        got = subprocess.run(["corolla", "generate", "--model", f"{work}/{name}", "--prompt-ids",
                              ",".join(map(str, prompt)), "--max-new-tokens", "48", "--ignore-eos",
                              "--print-ids", "--device", device],
                             capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
        same = [int(t) for t in got.split()] == want
        failed |= not same
        print(f"{name} {device}: {'equal to' if same else 'DIFFERENT from'} transformers over {len(want)} tokens")
sys.exit(1 if failed else 0)
