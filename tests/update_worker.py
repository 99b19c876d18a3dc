"""torchrun worker of tests/test_train_update.py: the real FSDP2 update on 2 processes, each holding
the records of its own tasks, against the single-process autograd reference of the whole mini-batch.
Usage: torchrun --nproc_per_node=2 tests/update_worker.py OUT.json LOSS_AGG [on|off: --share-prompts]"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from update_case import ARGV, make_records, reference_grads  # noqa: E402

import train_semionline as ts  # noqa: E402
import utils  # noqa: E402
import vlm  # noqa: E402
from extras.shared_prompt import collate_shared  # noqa: E402

d = utils.init_distributed("cpu")
args = ts.parser.parse_args(ARGV + ["--loss-agg", sys.argv[2]])
model = vlm.load_model("tiny", seed=0)
records, pad_id = make_records(model)  # identical on both ranks (seeded sampling, same weights)
ref_model = vlm.load_model("tiny", seed=0)
ref = reference_grads(ref_model, records, args)
mine = [r for r in records if r.task_idx % d.world_size == d.rank]  # this rank's tasks
share = len(sys.argv) > 3 and sys.argv[3] == "on"
policy = vlm.apply_fsdp(model, vlm.PolicyLogProb(model), d, mixed_precision=False)
opt = torch.optim.SGD(policy.parameters(), lr=0.0)
mb = ts._micro_batches(mine, 1, 2, d)[0]
fallback = mine[:1]


def collate(chunk):
    rs = chunk if chunk is not None else fallback
    rows = [r.prompt for r in rs], [r.response_ids for r in rs], pad_id
    return collate_shared(*rows, model.config.image_token_id) if share else vlm.collate_sequences(*rows)


st = ts.ppo_step(policy, opt, mb, collate, d, **ts.loss_config(args, sampler=args))
# rows that ran on another row's head (0 without sharing): the case must exercise the shared path
shared = sum(len(c) - len(collate(c)["head_len"]) for c in mb if c is not None) if share else 0
worst, scale = 0.0, max(g.abs().max().item() for g in ref.values())
for n, p in policy.named_parameters():
    name = n.removeprefix("model.")
    g = p.grad.full_tensor() if p.grad is not None else None
    if name in ref:
        worst = max(worst, (g - ref[name]).abs().max().item())
if d.is_main:
    Path(sys.argv[1]).write_text(json.dumps({"worst": worst, "scale": scale, "n_micro": len(mb), "n_mine": len(mine),
                                             "n_records": len(records), "skipped": st["skipped"],
                                             "shared_rows": shared}))
utils.cleanup_distributed()
