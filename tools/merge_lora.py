"""Merge a LoRA checkpoint (train_sft.py / train_semionline.py --lora-r) into a plain Hugging Face folder.

The adapters (lora.py; PEFT layout: adapter_config.json, adapter_model.safetensors) are merged into the base
model named in the checkpoint's lora_base.json (PEFT's merge_and_unload, fp32 on CPU) and written as
config.json + model.safetensors + the tokenizer (+ args.json), which eval_sop.py, --model and
--ref-model take like any other model folder. The trainers' --merge does the same at the end of a run.

    python tools/merge_lora.py out/sft/ckpt --out out/sft/merged
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: cli, utils, vlm
import cli  # noqa: E402
import utils  # noqa: E402
import vlm  # noqa: E402
from extras.merge import merge_checkpoint  # noqa: E402

parser = cli.make_parser(__doc__)
parser.add_argument("ckpt", type=cli.arg_type(vlm.model_path), help="a LoRA checkpoint folder, or a run's ckpt/ (its `latest` is followed)")
parser.add_argument("--out", required=True, help="the folder to write (created; files in it are overwritten)")


def main(argv=None):
    args = parser.parse_args(argv)
    if not utils.is_adapter_dir(args.ckpt):
        raise utils.UsageError(f"{args.ckpt}: not a LoRA checkpoint (no {utils.ADAPTER_FILE})")
    out = merge_checkpoint(args.ckpt, args.out)
    print(f"wrote {out}")
    return str(out)


if __name__ == "__main__":
    cli.run_script(main)
