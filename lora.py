"""LoRA for SFT and RL through PEFT (--lora-r > 0, or a LoRA checkpoint folder): the adapted policy,
its reference, its checkpoints. Imported only then; its flags are fields of the stage configs
(configs.common.StageConfig: --lora-r 0, the default, is full fine-tuning and imports neither this
module nor PEFT).

`apply_lora` injects PEFT LoRA adapters into the decoder's linear layers (the vision tower and the
merger stay frozen unless --lora-vision), in place: the trainers keep calling the same Hugging Face
model (PolicyLogProb, the sampler, FSDP2's `apply_fsdp` per decoder layer then the root); only the
parameters with requires_grad (the adapters) reach the optimizer (utils.adamw). RL's KL reference is
the same policy with its adapters disabled (`AdaptersOff`): no second model. Checkpoints hold the
adapter in PEFT's layout (adapter_config.json, adapter_model.safetensors) plus `lora_base.json` (the
base model and its init seed); `merge_adapter` gives the plain model (vlm.load_model of such a folder;
extras/merge.py: tools/merge_lora.py and the trainers' --merge).
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import torch

import utils

DECODER_TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"  # --lora-targets' default: all
VISION_TARGETS = ("qkv", "proj", "gate_proj", "up_proj", "down_proj")  # a vision block's (with --lora-vision)
ADAPTER_FILE, BASE_FILE = utils.ADAPTER_FILE, "lora_base.json"


class LoraError(utils.InputError, ValueError):
    """A LoRA flag that does not fit the model (cli.run_script reports it as one line, exit 2)."""


def adapter_flags(flags: dict) -> list[tuple[str, object]]:
    """[(flag, value)] the adapters' shapes and scale depend on, from vars(args) or an args.json (missing
    keys: the defaults): --lora-r, and with a rank --lora-alpha (2 x rank by default), the target set, --lora-vision."""
    r = int(flags.get("lora_r") or 0)
    targets = sorted(t.strip() for t in str(flags.get("lora_targets") or DECODER_TARGETS).split(",") if t.strip())
    return [("--lora-r", r)] + ([("--lora-alpha", f"{float(flags.get('lora_alpha') or 2 * r):g}"),
                                 ("--lora-targets", ",".join(targets)),
                                 ("--lora-vision", bool(flags.get("lora_vision")))] if r else [])


def check_resume(args, ckpt) -> None:
    """--resume from checkpoint folder `ckpt` (None: nothing to resume) rebuilds its adapters only with the
    flags of its args.json (`adapter_flags`): another alpha would silently rescale the trained adapters,
    another rank or target set cannot load. args: the run's config (its lora_* fields). The trainers'
    --resume calls it (extras.resume.check_flags) before --out is written, with --lora-r or when `ckpt`
    is a LoRA checkpoint (utils.is_adapter_dir).
    Raises LoraError (one line: the flag, this run's value, the checkpoint's)."""
    saved = Path(ckpt or "") / "args.json"
    if ckpt is None or not saved.is_file():
        return
    for (flag, old), (_, new) in zip(adapter_flags(json.loads(saved.read_text())), adapter_flags(vars(args))):
        if old != new:
            raise LoraError(f"--resume: {flag} {new} differs from the checkpoint's {old} ({saved}); resume "
                            "with the checkpoint's LoRA flags, or start a new run in another --out")


def next_stage_flags(args) -> str:
    """The LoRA flags of the RL command train_sft.py prints after a LoRA SFT (" --lora-r R --lora-alpha A"
    [--lora-targets, --lora-dropout, --lora-vision when not the defaults]; "" without LoRA). RL then loads
    the SFT checkpoint merged (vlm.load_model) and trains fresh adapters on it, so its KL reference (the
    adapters off) is the SFT policy, and it fits where the SFT did: a full fine-tune of the merged
    model is what the LoRA SFT avoided."""
    if not args.lora_r:
        return ""
    (_, r), (_, alpha), (_, targets), _ = adapter_flags(vars(args))
    flags = f" --lora-r {r} --lora-alpha {alpha}"
    if targets != ",".join(sorted(DECODER_TARGETS.split(","))):
        flags += f" --lora-targets {targets}"
    if args.lora_dropout:
        flags += f" --lora-dropout {args.lora_dropout:g}"
    return flags + (" --lora-vision" if args.lora_vision else "")


def apply_lora(model, args, base: str, seed: int = 0):
    """Inject LoRA adapters (args: --lora-* flags) into `model` (Qwen2_5_VLForConditionalGeneration)
    in place and freeze everything else; returns the PeftModel around it (None when --lora-r is 0:
    `model` untouched). The adapters' A matrices are drawn from `seed` in a forked RNG (the same on
    every rank and run; the global generators are not advanced), B is zero: the adapted model starts
    as the base exactly. base (the model name or folder) and seed go to lora_base.json of every
    checkpoint. Raises LoraError naming a --lora-targets entry that is no linear layer of a decoder
    layer."""
    if not args.lora_r:
        return None
    from peft import LoraConfig, get_peft_model

    names = [t.strip() for t in (args.lora_targets or DECODER_TARGETS).split(",") if t.strip()]
    have = {n.rsplit(".", 1)[-1] for n, m in model.model.language_model.layers.named_modules()
            if isinstance(m, torch.nn.Linear)}
    missing = sorted(set(names) - have)
    if missing:
        raise LoraError(f"--lora-targets: {', '.join(missing)} not a linear layer of a decoder layer (have: {', '.join(sorted(have))})")
    pattern = rf"model\.language_model\.layers\.\d+\..*\b({'|'.join(map(re.escape, names))})"
    if args.lora_vision:
        pattern = rf"(?:{pattern}|model\.visual\.blocks\.\d+\..*\b({'|'.join(VISION_TARGETS)}))"
    cfg = LoraConfig(r=args.lora_r, lora_alpha=args.lora_alpha or 2 * args.lora_r, lora_dropout=args.lora_dropout,
                     target_modules=pattern, bias="none")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        peft_model = get_peft_model(model, cfg)
    peft_model.peft_config["default"].base_model_name_or_path = str(base)  # adapter_config.json's record
    peft_model.uis1_base = {"model": str(base), "seed": int(seed)}
    return peft_model


class AdaptersOff:
    """RL's frozen reference under LoRA: `policy` (the module training calls, e.g. the FSDP root)
    run with the adapters of `peft_model` disabled, i.e. the base model. Called like the policy."""

    def __init__(self, policy, peft_model):
        self.policy, self.peft_model = policy, peft_model

    def __call__(self, *args, **kwargs):
        with self.peft_model.disable_adapter():
            return self.policy(*args, **kwargs)


def _file_key(name: str) -> str:
    """A trainable parameter's name in the training module (PolicyLogProb's 'model.' prefix, PEFT's
    adapter name 'default') -> its key in adapter_model.safetensors (PEFT's layout)."""
    name = name.removeprefix("model.") if name.startswith("model.model.") else name
    return "base_model.model." + name.replace(".default.", ".")


def adapter_state_dict(module) -> dict:
    """{file key: full fp32 CPU tensor} of every trainable parameter of `module` (plain or FSDP2:
    each sharded parameter is gathered, so this is a collective: every rank calls it in the same
    order). Keys as adapter_model.safetensors holds them."""
    out = {}
    for name, p in module.named_parameters():
        if p.requires_grad:
            t = p.full_tensor() if hasattr(p, "full_tensor") else p
            out[_file_key(name)] = t.detach().float().cpu().contiguous()
    return out


def save_adapter(peft_model, state: dict, folder: str | os.PathLike) -> None:
    """Write the adapter in PEFT's layout (adapter_config.json, adapter_model.safetensors) and
    lora_base.json into `folder`. state: adapter_state_dict's. Rank 0 only (no collective)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    peft_model.peft_config["default"].save_pretrained(str(folder))
    save_file(state, str(folder / ADAPTER_FILE), metadata={"format": "pt"})
    (folder / BASE_FILE).write_text(json.dumps(peft_model.uis1_base))


def load_adapter_state(folder, module) -> None:
    """Copy adapter_model.safetensors of `folder` into the trainable parameters of `module` (plain or
    FSDP2: each rank keeps its shard). Raises LoraError (a ValueError; one line from the trainers) when
    the adapters differ (names or shapes: another --lora-r or --lora-targets; check_resume says which first)."""
    from safetensors.torch import load_file

    saved = load_file(str(Path(folder) / ADAPTER_FILE))
    params = {_file_key(n): p for n, p in module.named_parameters() if p.requires_grad}
    theirs, ours = {k: tuple(v.shape) for k, v in saved.items()}, {k: tuple(p.shape) for k, p in params.items()}
    if theirs != ours:
        k = next(k for k in sorted(theirs.keys() | ours.keys()) if theirs.get(k) != ours.get(k))
        raise LoraError(f"{folder}: its adapter {k} has shape {theirs.get(k)}, this run's {ours.get(k)} (None: "
                        "absent): resume with the same --lora-r, --lora-targets and --lora-vision")
    with torch.no_grad():
        for k, p in params.items():
            if hasattr(p, "full_tensor"):  # a DTensor shard: distribute the full tensor the same way
                from torch.distributed.tensor import distribute_tensor
                p.copy_(distribute_tensor(saved[k].to(p.dtype), p.device_mesh, p.placements))
            else:
                p.copy_(saved[k].to(p.dtype))


def read_base(folder) -> dict:
    """lora_base.json of a LoRA checkpoint folder: {"model": the base's name or folder, "seed": its
    init seed}. Raises FileNotFoundError without it."""
    path = Path(folder) / BASE_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{folder}: a LoRA adapter without {BASE_FILE} (which base model it adapts)")
    return json.loads(path.read_text())


def merge_adapter(folder, load_model):
    """The plain adapted model of LoRA checkpoint `folder` (vlm.load_model of it): its base (read_base,
    loaded by `load_model(name, seed=...)`, fp32 on CPU) with the adapters merged into the base weights
    (PEFT's PeftModel.from_pretrained, merge_and_unload), every parameter trainable as from_pretrained's
    are (PEFT had frozen the base; RL may fine-tune the merged model fully)."""
    from peft import PeftModel

    base = read_base(folder)
    model = load_model(base["model"], seed=base["seed"])
    return PeftModel.from_pretrained(model, str(folder)).merge_and_unload().requires_grad_(True)
