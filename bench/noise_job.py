"""A job for bench/baseline_noise.sh: a 2-layer BERT (transformers, built from
its config, nothing downloaded) fine-tuned 20 steps on the CPU on sentences
of 16 to 128 tokens padded per batch; the seed (argv[1]) sets the weights
and the data order."""

import sys, random, torch
from transformers import BertConfig, BertForSequenceClassification
seed = int(sys.argv[1])
torch.manual_seed(seed); random.seed(seed)
config = BertConfig(vocab_size=2000, hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256)
model = BertForSequenceClassification(config)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
# A dataset of sentences of 16 to 128 tokens; batches padded to their longest.
data = [torch.randint(0, 2000, (random.Random(i).randint(16, 128),)) for i in range(400)]
order = list(range(len(data))); random.shuffle(order)
for step in range(20):
    batch = [data[i] for i in order[step * 16:(step + 1) * 16]]
    longest = max(len(x) for x in batch)
    ids = torch.zeros(len(batch), longest, dtype=torch.long)
    mask = torch.zeros(len(batch), longest, dtype=torch.long)
    for j, x in enumerate(batch):
        ids[j, :len(x)] = x; mask[j, :len(x)] = 1
    out = model(input_ids=ids, attention_mask=mask, labels=torch.zeros(len(batch), dtype=torch.long))
    opt.zero_grad(); out.loss.backward(); opt.step()
