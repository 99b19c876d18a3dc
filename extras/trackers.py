"""The experiment trackers of --report-to (TensorBoard, Weights & Biases, Trackio), imported only when
the flag names one: `check_names` checks the flag's value while it is parsed (configs.flags.ReportTo);
`TrackedLogger` writes metrics.jsonl as utils.MetricsLogger does and hands every row to the trackers
(configs.common.metrics_logger picks it for them, and for a --resume: it keeps the rows up to the
checkpoint, extras.resume.trim_metrics)."""
from __future__ import annotations

import importlib
import json
import os

import utils
from extras.resume import trim_metrics

# the trackers, named as transformers' and TRL's `report_to` names them; the module each one needs
# (torch.utils.tensorboard imports the tensorboard package)
TRACKERS = {"tensorboard": "torch.utils.tensorboard", "wandb": "wandb", "trackio": "trackio"}


def check_names(values) -> tuple[str, ...]:
    """--report-to's names, each once: "none" alone, or names of TRACKERS whose packages import.
    Raises ValueError with the message the parser prints (after `argument --report-to: `)."""
    names = tuple(dict.fromkeys(values))
    for name in names:
        if name != "none" and name not in TRACKERS:
            raise ValueError(f"{name!r}: expected none or one or more of {', '.join(TRACKERS)}")
    if "none" in names and len(names) > 1:
        raise ValueError(f"'none' cannot be combined with {', '.join(n for n in names if n != 'none')}")
    for name in names:
        if name != "none":
            _module(name, ValueError)
    return names


def _module(name: str, error=utils.UsageError):
    """The module of tracker `name`; its missing package raises `error` naming the pip command."""
    try:
        return importlib.import_module(TRACKERS[name])
    except (ImportError, KeyError):
        raise error(f"{name} needs the {name} package: pip install {name}") from None


class TrackedLogger(utils.MetricsLogger):
    """utils.MetricsLogger plus the trackers of `report_to` (TRACKERS keys; "none": none): every finite
    number of a row, bools and text left out, at x = row["step"] (else the row's index); tensorboard as
    scalars in path's folder/tensorboard, wandb and trackio as one run named after path's folder, in
    project $WANDB_PROJECT / $TRACKIO_PROJECT (else "ui-s1"; transformers reads the same variables),
    with `config` (the run's args) attached. Rank 0 only. Raises UsageError when a tracker's package
    is missing (the trainers' --report-to has already checked, while parsing). close() ends the runs.

    resume_step: a --resume from the checkpoint of that step (0: none found, a new run). TensorBoard
    gets purge_step = resume_step + 1 (a new run: 0), so the steps redone after the checkpoint show
    once; W&B (same id) and trackio (same name) continue, with resume="allow", the run of path's
    folder/trackers.json, where a new run records its own. W&B's steps only grow: it keeps the values
    it has for the redone steps (its run rewind is a preview feature)."""

    def __init__(self, path, append: bool = False, report_to=(), config: dict | None = None,
                 resume_step: int | None = None):
        kept = trim_metrics(path, resume_step) if resume_step is not None else 0
        super().__init__(path, append=append or resume_step is not None)
        self.n = kept  # a row without "step" is drawn at its index in the file
        self.tb = self.wandb = self.trackio = None
        names = [n for n in report_to or () if n != "none"] if utils.get_rank() == 0 else []
        modules = {name: _module(name) for name in names}
        folder, config, record = self.path.parent, utils.finite_json(dict(config or {})), self.path.parent / "trackers.json"
        runs = json.loads(record.read_text()) if resume_step and record.is_file() else {}
        again = {"resume": "allow"}  # the run a resume continues: W&B by its id, trackio by its name
        if "tensorboard" in modules:
            purge = None if append and resume_step is None else resume_step + 1 if resume_step else 0
            self.tb = modules["tensorboard"].SummaryWriter(str(folder / "tensorboard"), purge_step=purge)
        if "wandb" in modules:
            w = runs.get("wandb") or {"project": os.environ.get("WANDB_PROJECT", "ui-s1")}
            self.wandb = modules["wandb"].init(project=w["project"], name=folder.name, config=config, dir=str(folder),
                                               **({"id": w["id"], **again} if "id" in w else {}))
            runs["wandb"] = {"project": w["project"], "id": self.wandb.id}
        if "trackio" in modules:
            t = runs.get("trackio") or {"project": os.environ.get("TRACKIO_PROJECT", "ui-s1"), "name": folder.name}
            self.trackio, resumed = modules["trackio"], again if "trackio" in runs else {}
            self.trackio.init(project=t["project"], name=t["name"], config=config, **resumed)
            runs["trackio"] = t
        if runs:
            record.write_text(json.dumps(runs, indent=2))

    def log(self, row: dict) -> dict | None:
        x = row.get("step", self.n)
        row = super().log(row)
        if row is None:
            return None
        self.n += 1
        scalars = {k: v for k, v in utils.finite_json(row).items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step"}
        if self.tb is not None:
            for k, v in scalars.items():
                self.tb.add_scalar(k, v, x)
            self.tb.flush()
        for run in (self.wandb, self.trackio):
            if run is not None:
                run.log(scalars, step=x)
        return row

    def close(self) -> None:
        """End the trackers' runs (rank 0; a no-op without trackers or elsewhere)."""
        if self.tb is not None:
            self.tb.close()
        for run in (self.wandb, self.trackio):
            if run is not None:
                run.finish()
        self.tb = self.wandb = self.trackio = None
