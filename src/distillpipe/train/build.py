"""Building a training run (the first of the loop's named parts, :mod:`distillpipe.train.loop`): the student, the
objective, the optimizer, the data and the run's identity, for one process or one rank of several.

:func:`build_run` returns a :class:`TrainingRun`, the state every other part reads and advances;
:func:`run_identity` is what a checkpoint must match to be resumed (see the loop's module docstring).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from distillpipe.config.finetune import FinetuneRunConfig
from distillpipe.config.run import LoaderConfig, RunConfig
from distillpipe.config.students import StudentConfig
from distillpipe.config.train import TrainRunConfig
from distillpipe.data.collate import TrainDataError, collate
from distillpipe.data.schema import read_meta
from distillpipe.data.word_vectors import load_table
from distillpipe.evaluate.student import primary_metric
from distillpipe.identity import code_identity, json_sha256, sha256_dir, stage_code
from distillpipe.runtime import adamw, rng_state, seed_everything, set_rng_state
from distillpipe.scale.ddp import ProcessGroup, join
from distillpipe.store.anchor import prove_store
from distillpipe.store.reader import open_store
from distillpipe.students import build_student, load_student
from distillpipe.students.base import INPUT_VECTORS, TaskSpec, freeze_for_tuning, set_input_vectors
from distillpipe.teacher.live import LiveSettings, LiveTeacher, live_teacher
from distillpipe.train.data import Mixture, Source
from distillpipe.train.embedding_init import EmbeddingInitError, init_from_teacher
from distillpipe.train.objective import Objective, aligned_blocks, embedding_stage, probe_student, store_names
from distillpipe.train.schedule import Schedule, build_schedule
from distillpipe.train.terms import check_names

log = logging.getLogger(__name__)


def task_spec(meta: dict, run: RunConfig, signals, teacher_config: dict) -> TaskSpec:
    """The student's task from the tokens' meta.json, the run's params and the teacher cache (its signal spec and
    its teacher's model config: a regression task is cast to the bins the teacher was fine-tuned on)."""
    kind = meta["kind"]
    bin_width = None
    if kind == "classification":
        if meta.get("task_type") == "regression":
            # CMOW paper sec. IV-A (after Raffel et al.): STS-B as classification over 0.2-wide bins, the teacher's
            bin_width = (teacher_config.get("distillpipe") or {}).get("regression_bin_width")
            if not bin_width:
                raise TrainDataError(f"{meta['name']} is a regression task, but its teacher was not "
                                     "fine-tuned on bins (its config has no distillpipe.regression_bin_width): "
                                     "fine-tune it with teacher_finetune and regression_bin_width set")
            if not signals.n_classes:
                raise TrainDataError(f"{meta['name']} is a regression task: its teacher targets must hold the "
                                     "logits over the bins (teacher_cache signals.logits: true)")
            num_labels = signals.n_classes
        else:
            names = meta.get("label_names")
            num_labels = len(names) if names else int(meta.get("num_labels") or 0)
        if signals.n_classes and signals.n_classes != num_labels:
            raise TrainDataError(f"the teacher's logits have {signals.n_classes} classes, the tokens {num_labels}")
    else:
        num_labels = 0
    if (kind == "classification") != (run.head is not None):
        raise TrainDataError(f"head must be set for classification datasets and null otherwise ({meta['name']} is "
                             f"{kind})")
    tok = meta["tokenizer"]
    return TaskSpec(kind=kind, vocab_size=int(tok["vocab_size"]), max_seq_len=int(meta["max_seq_len"]),
                    pad_id=int(tok["pad_id"]), num_labels=num_labels, encoding=run.encoding, head=run.head,
                    bin_width=float(bin_width) if bin_width else None)


def _init_from(model: torch.nn.Module, init_dir: Path) -> None:
    """Copy the encoder of a trained student into ``model`` (heads stay freshly initialised); refuse any other
    difference, naming it."""
    source, record = load_student(init_dir, torch.device("cpu"))
    src = {k: v for k, v in source.state_dict().items() if not k.startswith(("head.", "mlm_head."))}
    dst = {k: v for k, v in model.state_dict().items() if not k.startswith(("head.", "mlm_head."))}
    if src.keys() != dst.keys():
        raise TrainDataError(f"cannot initialise from {init_dir}: encoder parameters differ "
                             f"(only there: {sorted(src.keys() - dst.keys())[:5]}, only here: "
                             f"{sorted(dst.keys() - src.keys())[:5]})")
    bad = [k for k in src if src[k].shape != dst[k].shape]
    if bad:
        raise TrainDataError(f"cannot initialise from {init_dir}: shapes differ for {bad[:5]}")
    model.load_state_dict(src, strict=False)
    log.info("initialised the encoder from %s (%s)", init_dir, record["name"])


def param_groups(modules: list[torch.nn.Module], weight_decay: float) -> list[dict[str, Any]]:
    """No weight decay on biases, norms and embedding tables (1-D tensors and nn.Embedding weights)."""
    decay, no_decay = [], []
    for m in modules:
        emb = {id(e.weight) for e in m.modules() if isinstance(e, torch.nn.Embedding)}
        for p in m.parameters():
            if not p.requires_grad:  # frozen by the run's `tune`: no gradient, no optimizer state
                continue
            (no_decay if p.ndim < 2 or id(p) in emb else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


CODE_STAGES = ("train", "train_aug", "finetune", "train_lm")
"""The stages that train students: their whole import closure (the training loop, the shared student code, losses,
objective, schedule, data, evaluation, and the commands that build the run from params), with the run's own
architecture (``students/<key>.py``, not the others), is part of a checkpoint's identity, so a run never
continues with code other than the code it started with. One identity for the four: an edit to another
training stage's command restarts a killed run instead of resuming it (minutes of a run, against the risk of
mixing code); an edit to another architecture does not."""


def run_identity(*, run: RunConfig, model_cfg: StudentConfig, loader_cfg: LoaderConfig, tokens_meta: dict,
                 sources: dict[str, Source], init_dir: str | Path | None, augment: tuple | None,
                 device: torch.device, processes: int, word_vectors: str | None = None) -> dict[str, Any]:
    """Everything that decides a run's weights, as digests: what a checkpoint must match to be resumed."""
    return {
        "params": json_sha256({"run": dataclasses.asdict(run), "model": dataclasses.asdict(model_cfg),
                               "loader": dataclasses.asdict(loader_cfg)}),
        "tokens": tokens_meta["fingerprint"],
        "teacher cache": {k: s.identity() for k, s in sources.items()},
        "augment tokens": read_meta(augment[1])["fingerprint"] if augment else None,
        "init weights": sha256_dir(init_dir) if init_dir is not None else None,
        "word vectors": word_vectors,
        "code": code_identity(stage_code(*CODE_STAGES, student=model_cfg.student)),
        "device": device.type,
        "processes": processes,
    }


class Trainable(torch.nn.Module):
    """The student and the objective's learned projections as one module: what DDP wraps and the optimizer
    updates. ``forward`` returns (loss or None, the loss terms)."""

    def __init__(self, student: torch.nn.Module, objective: Objective):
        super().__init__()
        self.student, self.objective = student, objective

    def forward(self, batch: dict[str, torch.Tensor], targets: dict[str, torch.Tensor], *,
                multipliers: dict[str, float], temperature: float, always_loss: bool = False):
        """``always_loss``: when no term applies to the batch (unlabeled rows, hard loss only), return a zero
        loss that touches every parameter instead of None, so that DDP's gradient reduction still runs on
        every process (the step is then skipped, as it is on one process)."""
        out = self.student(batch, return_hidden=self.objective.needs_hidden)
        loss, parts = self.objective(out, targets, multipliers=multipliers, temperature=temperature)
        if loss is None and always_loss:
            loss = sum(p.sum() for p in self.parameters()) * 0.0
        return loss, parts


def has_unused_parameters(trainable: Trainable, batch: dict[str, torch.Tensor], schedule_kind: str) -> bool:
    """Whether some trainable parameter can go without a gradient in a step, so that DDP must search the autograd
    graph for them every step (``find_unused_parameters``, an extra traversal each iteration, and a warning when
    it finds none): when the schedule switches terms off for a while (``slow_build``: the blocks above its stage,
    the projections of terms not yet on), when the student has an adaptive softmax (a batch whose targets miss a
    tail cluster leaves it out), or when a forward and backward of every output on ``batch`` leaves a parameter
    out (probed here, with the RNG states put back and the gradients cleared)."""
    if schedule_kind != "all_at_once":
        return True
    if any(isinstance(m, torch.nn.AdaptiveLogSoftmaxWithLoss) for m in trainable.modules()):
        return True
    state = rng_state()
    out = trainable.student(batch, return_hidden=trainable.objective.needs_hidden)
    total = sum(t.float().sum() for t in _tensors(out) if t.requires_grad)
    if isinstance(total, torch.Tensor):
        total.backward()
    unused = any(p.grad is None for p in trainable.student.parameters() if p.requires_grad)
    trainable.zero_grad(set_to_none=True)
    set_rng_state(state)
    return unused


def _tensors(x: Any) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if dataclasses.is_dataclass(x):
        return [t for f in dataclasses.fields(x) for t in _tensors(getattr(x, f.name))]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _tensors(v)]
    return []


@dataclass
class TrainingRun:
    """A built run and where it stands: everything the named parts of the loop share."""

    name: str
    run: RunConfig
    model_cfg: StudentConfig
    task: TaskSpec
    meta: dict
    group: ProcessGroup
    device: torch.device
    trainable: Trainable
    engine: torch.nn.Module
    """What the forward goes through: ``trainable``, or DDP around it."""
    optimizer: torch.optim.Optimizer
    params: list[torch.nn.Parameter]
    data: Mixture
    sources: list[Source]
    schedule: Schedule
    total: int
    dev_rows: Any
    prepared_dir: Path | None
    metric: str
    identity: dict[str, Any]
    ckpt_dir: Path
    step: int = 0
    best_step: int = 0
    bad_evals: int = 0
    stopped_early: bool = False
    last_eval: int = -1
    best: dict[str, float] | None = None
    best_state: dict[str, torch.Tensor] | None = None
    steps_log: list[dict[str, Any]] = field(default_factory=list)
    dev_log: list[dict[str, Any]] = field(default_factory=list)

    @property
    def student(self) -> torch.nn.Module:
        return self.trainable.student

    @property
    def pairs(self) -> bool:
        return self.run.encoding == "diffcat"


def build_run(name: str, *, model_cfg: StudentConfig, run: RunConfig, loader_cfg: LoaderConfig, device: str,
              tokens_dir: str | Path, store_path: str | Path | LiveSettings, prepared_dir: str | Path | None,
              ckpt_dir: str | Path, init_dir: str | Path | None = None,
              augment: tuple[str, str | Path, str | Path] | None = None,
              loader_workers: int = 0, word_vectors: str | Path | None = None) -> TrainingRun:
    """Everything a run needs before its first step, on this process (joining the process group under
    torchrun). ``store_path``: the dataset's teacher cache, or :class:`~distillpipe.teacher.live.LiveSettings` to run
    the teacher on each batch instead (:mod:`distillpipe.teacher.live`). ``augment``: (name, tokens dir, cache) of
    unlabeled rows of the same kind mixed into training (teacher losses only). ``word_vectors``: a word_vectors table
    folder, copied into the student's fixed input vectors (ELMo-C); its digest joins the run's identity."""
    from datasets import load_from_disk

    check_names(run.objective, f"run {name}: objective")
    tokens_dir = Path(tokens_dir)
    meta = read_meta(tokens_dir)
    group, dev = join(device)
    for path in (store_path, *(augment or ())[2:]):  # its files are the ones git's dvc.lock names, before any is read
        if isinstance(path, LiveSettings):
            prove_store(path.teacher_dir, what="teacher")  # a live teacher's weights decide every target
        else:
            prove_store(path)
    if isinstance(store_path, LiveSettings):
        teacher: Path | LiveTeacher = live_teacher(store_path, tokens_dir, str(dev))
        signals, teacher_config = teacher.spec, teacher.facts.config
    else:
        teacher = Path(store_path)
        store = open_store(teacher, {"tokens_fingerprint": meta["fingerprint"], "split": "train"})
        signals, teacher_config = store.manifest.signals, store.manifest.teacher.config
    task = task_spec(meta, run, signals, teacher_config)
    opt = run.optim

    seed_everything(opt.seed)
    student = build_student(model_cfg, task)
    if init_dir is not None:
        _init_from(student, Path(init_dir))
    vectors_digest = None
    if word_vectors is not None:
        table, vectors_digest = load_table(word_vectors, tokenizer_sha256=meta["tokenizer"]["sha256"])
        try:
            set_input_vectors(student, table)
        except ValueError as e:
            raise TrainDataError(f"{name}: {e}") from None
    elif hasattr(student, INPUT_VECTORS) and init_dir is None:
        raise TrainDataError(f"{name}: this student ({model_cfg.student}) reads a fixed word-vector table: train it "
                             "as a train_lm run (word_vectors: <table>), or initialise it from one (finetune)")
    tune = run.tune if isinstance(run, FinetuneRunConfig) else "full"
    try:
        n_trainable, n_params = freeze_for_tuning(student, tune)
    except ValueError as e:
        raise TrainDataError(f"{name}: {e}") from None
    log.info("%s: %s of %s student parameters train (tune: %s)", name, f"{n_trainable:,}", f"{n_params:,}", tune)
    student.to(dev)

    names = store_names(run.objective, task.kind, signals)
    loader_kw = {"batch_size": opt.batch_size, "seed": opt.seed, "block_rows": loader_cfg.block_rows,
                 "buffer_blocks": loader_cfg.buffer_blocks, "streams": loader_cfg.streams,
                 "num_workers": loader_workers, "rank": group.rank, "world": group.world}
    fresh = isinstance(run, TrainRunConfig) and run.mlm_views == "fresh"
    source = Source(meta["name"], tokens_dir, teacher, names, fresh_masks=fresh, **loader_kw)
    if getattr(model_cfg, "embedding_init", None) == "teacher" and init_dir is None:  # (finetune: init's weights)
        try:
            init_from_teacher(student, source.constants, where=f"run {name} ({store_path})")
        except EmbeddingInitError as e:
            raise TrainDataError(str(e)) from None
    sources = [source]
    by_role = {"dataset": source}
    if augment is not None:
        aug_name, aug_tokens, aug_store = augment
        extra = Source(aug_name, aug_tokens, aug_store, names, **loader_kw)
        if extra.info.kind != source.info.kind or extra.info.signals.to_dict() != signals.to_dict():
            raise TrainDataError(f"augment {aug_name} must have the kind and cached signals of {meta['name']} "
                                 f"({extra.info.kind} vs {source.info.kind}; compare their teacher_cache signals)")
        sources.append(extra)
        by_role["augment"] = extra
    for s in sources:
        if not embedding_stage(run.objective):  # no embedding loss reads them (a live teacher computes them anyway)
            s.without_embedding_targets()
        s.to(dev)
    data = Mixture(sources, opt.seed)
    probe_rows = source.rows.select_columns(source.columns)[:2]
    probe_batch, _ = collate(probe_rows, kind=task.kind, pad_id=task.pad_id, labeled=True,
                             pairs=run.encoding == "diffcat", bin_width=task.bin_width)
    dims = probe_student(student, {k: v.to(dev) for k, v in probe_batch.items()})
    objective = Objective(run.objective, kind=task.kind, signals=signals, dims=dims).to(dev)
    trainable = Trainable(student, objective)
    engine: torch.nn.Module = trainable
    if group.distributed:
        # every rank starts from the same weights (same seed; DDP broadcasts rank 0's anyway), but draws its
        # own dropout masks from here on
        torch.manual_seed(opt.seed * 7919 + group.rank)
        engine = DistributedDataParallel(trainable, device_ids=[dev.index] if dev.type == "cuda" else None,
                                         find_unused_parameters=has_unused_parameters(
                                             trainable, {k: v.to(dev) for k, v in probe_batch.items()},
                                             run.objective.schedule.kind))
    optimizer = adamw(param_groups([trainable], opt.weight_decay), lr=opt.lr)
    params = [p for g in optimizer.param_groups for p in g["params"]]

    per_epoch = []
    for e in range(opt.epochs):
        data.set_epoch(e)
        per_epoch.append(len(data))
    data.set_epoch(0)
    total = sum(per_epoch) if opt.max_steps is None else min(sum(per_epoch), opt.max_steps)
    schedule = build_schedule(run.objective.schedule, blocks=aligned_blocks(run.objective), total_steps=max(total, 1),
                              embedding_stage=embedding_stage(run.objective))
    splits = load_from_disk(str(tokens_dir))
    if "dev" not in splits:
        raise TrainDataError(f"{tokens_dir} has no dev split: the loop evaluates (and early-stops) on dev; give the "
                             "dataset a dev split in prepare (splits.dev > 0)")
    identity = run_identity(run=run, model_cfg=model_cfg, loader_cfg=loader_cfg, tokens_meta=meta, sources=by_role,
                            init_dir=init_dir, augment=augment, device=dev, processes=group.world,
                            word_vectors=vectors_digest)
    return TrainingRun(name=name, run=run, model_cfg=model_cfg, task=task, meta=meta, group=group, device=dev,
                       trainable=trainable, engine=engine, optimizer=optimizer, params=params, data=data,
                       sources=sources, schedule=schedule, total=total, dev_rows=splits["dev"],
                       prepared_dir=Path(prepared_dir) if prepared_dir is not None else None,
                       metric=primary_metric(task.kind, meta, lm=dims.lm), identity=identity,
                       ckpt_dir=Path(ckpt_dir))
