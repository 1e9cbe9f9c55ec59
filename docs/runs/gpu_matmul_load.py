"""Another process's work on one GPU: bf16 8192x8192 matmuls back to back for SECONDS (the
"GPU shared" fault of the run scripts under docs/runs/: a load the PP-loop probe's own switches
do not make, so a diagnosis cannot know how it was made).
    python3 docs/runs/gpu_matmul_load.py DEVICE SECONDS      e.g. cuda:1 200"""
import sys
import time

import torch

dev, seconds = sys.argv[1], float(sys.argv[2])
a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
t = time.time()
while time.time() - t < seconds:
    for _ in range(50):
        a = (a @ a).clamp_(-1, 1)
    torch.cuda.synchronize(dev)
