"""Steps per second of a CUDA training job, as `bench/cuda_capture.sh` runs
it with and without `snapdiff capture`: a 6-layer transformer encoder
(d_model 512, batch 32 x 128 tokens, AdamW), timed after 20 warm-up steps,
with each dump's time inside the timed steps. Prints one JSON line. (On
the CPU where torch sees no GPU: only to try the scripts.)

    python3 bench/cuda_capture.py [STEPS]
"""
import json
import sys
import time

import torch
from torch import nn


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    layer = nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True)
    model = nn.Sequential(nn.Embedding(1000, 512), nn.TransformerEncoder(layer, 6)).to(device)
    head = nn.Linear(512, 1000).to(device)
    params = list(model.parameters()) + list(head.parameters())
    opt = torch.optim.AdamW(params, lr=1e-4)
    tokens = torch.randint(0, 1000, (32, 128), device=device)

    def step():
        logits = head(model(tokens))
        loss = nn.functional.cross_entropy(logits.view(-1, 1000), tokens.view(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    for _ in range(20):
        step()
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    seconds = time.perf_counter() - start
    print(json.dumps({"steps": steps, "seconds": seconds, "steps_per_s": steps / seconds}))


if __name__ == "__main__":
    main()
