"""A transformers-sized job for the cost of `capture --owners` (CPU): a
small BERT trained with AdamW, a dataset of 100,000 records in memory, and
a leak (each step's output kept in a list).

    snapdiff capture --owners --every 2 -o /tmp/owners-job -- python3 bench/owners_job.py

capture's summary says how long its dumps held the job, and how much of
that finding owners took."""

import torch
from transformers import BertConfig, BertModel

model = BertModel(
    BertConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256)
)
optimizer = torch.optim.AdamW(model.parameters())
records = [{"id": i, "tags": [i, str(i)]} for i in range(100_000)]
history = []
ids = torch.randint(0, 1000, (4, 32))
for step in range(12):
    out = model(ids).last_hidden_state
    loss = out.square().mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    history.append(out.detach() * 1)  # the leak
