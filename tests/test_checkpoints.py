"""Checkpoints: the resume-or-restart decision the three training loops share (students, teacher_finetune,
qg_finetune), on identities of both shapes they use; a full disk: one message with the space needed, the
older checkpoints untouched, no partial file; and no checkpoint unpickled: a crafted pickle is refused with one
message and runs no code, one of an older version starts the run over, a damaged one falls back."""

import errno
import logging
import os
import pickle
import random
import re

import numpy as np
import pytest
import torch
import typer
from _fulldisk import FullDisk

from distillpipe.checkpoints import (
    CheckpointRefused,
    list_checkpoints,
    load_latest,
    resume_or_restart,
    save_checkpoint,
    state_bytes,
)
from distillpipe.commands.base import user_errors
from distillpipe.errors import DiskFull
from distillpipe.runtime import rng_state, set_rng_state


def _state(step):
    w = torch.randn(200, 500, generator=torch.Generator().manual_seed(step))
    return {"model": {"w": w, "tied": w}, "optimizer": {"m": torch.zeros(200, 500)}, "step": step,
            "log": [{"loss": 1.0}] * 10}


def test_full_disk_keeps_the_older_checkpoints_and_says_what_it_needs(tmp_path):
    folder = tmp_path / "ckpt"
    for step in (1, 2):
        save_checkpoint(folder, step, _state(step))
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    size = (folder / "step-000000002.pt").stat().st_size  # what a save of such a state writes
    assert state_bytes(_state(3)) == 2 * 200 * 500 * 4  # the tied tensor once, as torch.save writes it
    with FullDisk(folder, size // 2) as disk, pytest.raises(DiskFull) as err:
        save_checkpoint(folder, 3, _state(3))
    assert disk.failed
    msg = str(err.value)
    assert msg.startswith(f"no space left on device writing checkpoint {folder / 'step-000000003.pt'}: it needs ~")
    assert "resumes from step-000000002.pt" in msg and " is free on " in msg
    needs = float(re.search(r"needs ~([\d.,]+) MB", msg).group(1))
    assert needs == pytest.approx(size / 1e6, rel=0.05)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before  # no partial file; the older ones intact
    assert load_latest(folder)["step"] == 2
    save_checkpoint(folder, 3, _state(3))  # the space is back
    assert [p.name for p in list_checkpoints(folder)] == ["step-000000002.pt", "step-000000003.pt"]
    assert torch.equal(load_latest(folder)["model"]["w"], _state(3)["model"]["w"])


def test_other_errors_keep_their_type(tmp_path, monkeypatch):
    def fsync(fd):
        raise OSError(errno.EIO, os.strerror(errno.EIO))  # a failing device: a bug or a fault, not a full disk

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(OSError) as err:
        save_checkpoint(tmp_path, 1, _state(1))
    assert err.type is OSError and err.value.errno == errno.EIO
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("value, kind", [(lambda: 0, "builtins.function"), (np.float64(0.5), "numpy.float64"),
                                         (np.zeros(3), "numpy.ndarray")])
def test_a_value_a_weights_only_load_cannot_rebuild_is_refused_when_saved(tmp_path, value, kind):
    with pytest.raises(TypeError, match=re.escape(f"checkpoint state['log'][1]['acc'] is a {kind}: ")):
        save_checkpoint(tmp_path, 1, {"step": 1, "log": [{"acc": 0.1}, {"acc": value}]})
    assert list(tmp_path.iterdir()) == []


def test_rng_states_round_trip_through_a_weights_only_checkpoint(tmp_path):
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    np.random.standard_normal()  # numpy then holds a cached gaussian: part of its state
    save_checkpoint(tmp_path, 1, {"rng": rng_state()})
    ahead = (random.random(), np.random.standard_normal(3).tolist(), torch.rand(3).tolist())
    set_rng_state(torch.load(tmp_path / "step-000000001.pt", weights_only=True)["rng"])
    assert (random.random(), np.random.standard_normal(3).tolist(), torch.rand(3).tolist()) == ahead


class _Payload:
    """Unpickled, this would run a shell command that creates ``flag``."""

    def __init__(self, flag):
        self.flag = flag

    def __reduce__(self):
        return os.system, (f"touch {self.flag}",)


def _crafted(path, flag, how):
    if how == "torch.save":  # a zip as torch.save writes, its data.pkl calling os.system
        torch.save({"identity": {"params": "p1"}, "step": 9, "x": _Payload(flag)}, path)
    else:  # a bare pickle, protocol 5 (STACK_GLOBAL)
        path.write_bytes(pickle.dumps({"step": 9, "x": _Payload(flag)}, protocol=5))


@pytest.mark.filterwarnings("ignore:Detected pickle protocol 5")
@pytest.mark.parametrize("how", ["torch.save", "pickle"])
def test_a_crafted_pickle_checkpoint_is_refused_with_one_message_and_runs_no_code(tmp_path, capsys, how):
    folder, flag = tmp_path / "ckpt", tmp_path / "code-ran"
    control = tmp_path / "control"
    pickle.loads(pickle.dumps(_Payload(control)))
    assert control.exists()  # the payload works: unpickled, it creates its file
    save_checkpoint(folder, 5, {"identity": dict(IDENTITY), "step": 5})  # a good older one: not silently used
    _crafted(folder / "step-000000009.pt", flag, how)

    with pytest.raises(CheckpointRefused) as err:
        resume_or_restart(folder, IDENTITY, key="identity")
    assert not flag.exists()  # nothing of the pickle ran
    msg = str(err.value)
    assert msg.startswith(f"refusing checkpoint {folder / 'step-000000009.pt'}: it is not a plain-weights "
                          "checkpoint (its pickle asks for posix.system, which no distillpipe checkpoint holds)")
    assert "It is not a damaged file" in msg and f"delete the file, or the whole folder {folder}" in msg
    assert [p.name for p in list_checkpoints(folder)] == ["step-000000005.pt", "step-000000009.pt"]  # both kept

    @user_errors
    def command():  # what every stage's command does with it
        resume_or_restart(folder, IDENTITY, key="identity")

    with pytest.raises(typer.Exit) as exit_:
        command()
    assert exit_.value.exit_code == 2 and not flag.exists()
    err_lines = capsys.readouterr().err.strip().splitlines()
    assert len(err_lines) == 1 and err_lines[0] == f"error: {msg}"


def test_a_checkpoint_of_an_older_version_starts_over_with_one_warning(tmp_path, caplog):
    """Before weights-only loading, checkpoints held numpy's RNG state (an ndarray) and numpy scalars."""
    old_rng = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    torch.save({"identity": dict(IDENTITY), "step": 5, "rng": old_rng, "best": {"acc": np.float64(0.5)}},
               tmp_path / "step-000000005.pt")
    with caplog.at_level(logging.WARNING):
        assert resume_or_restart(tmp_path, IDENTITY, key="identity") is None
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == [f"checkpoint {tmp_path / 'step-000000005.pt'} was written by an older distillpipe (its RNG "
                        "state is a numpy object, which a weights-only load refuses): starting over"]
    assert list_checkpoints(tmp_path) == []  # a newer run's checkpoints never sort below it


def test_a_damaged_checkpoint_falls_back_to_the_previous_one(tmp_path, caplog):
    save_checkpoint(tmp_path, 3, {"identity": dict(IDENTITY), "step": 3})
    path = save_checkpoint(tmp_path, 7, {"identity": dict(IDENTITY), "step": 7})
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])  # truncated, as by a failing disk
    with caplog.at_level(logging.WARNING):
        assert resume_or_restart(tmp_path, IDENTITY, key="identity")["step"] == 3
    assert f"checkpoint {path} is unreadable" in caplog.text and "trying an older one" in caplog.text


IDENTITY = {"params": "p1", "tokens": "t1", "code": "ast-v1:c1"}


def test_a_checkpoint_of_the_same_identity_is_resumed(tmp_path):
    save_checkpoint(tmp_path, 3, {"identity": dict(IDENTITY), "step": 3})
    save_checkpoint(tmp_path, 7, {"identity": dict(IDENTITY), "step": 7})
    assert resume_or_restart(tmp_path, IDENTITY, key="identity")["step"] == 7  # the newest
    save_checkpoint(tmp_path, 9, {"run_id": "abc", "step": 9})
    assert resume_or_restart(tmp_path, "abc", key="run_id")["step"] == 9
    assert resume_or_restart(tmp_path / "none", IDENTITY, key="identity") is None  # nothing to resume: no warning


def test_another_identity_starts_over_naming_what_changed(tmp_path, caplog):
    save_checkpoint(tmp_path, 5, {"identity": {**IDENTITY, "tokens": "t0", "code": "ast-v1:c0"}, "step": 5})
    with caplog.at_level(logging.WARNING):
        assert resume_or_restart(tmp_path, IDENTITY, key="identity") is None
    assert f"checkpoint in {tmp_path} was made with other tokens, code: starting over" in caplog.text
    assert list_checkpoints(tmp_path) == []


def test_a_digest_identity_names_what_it_covers(tmp_path, caplog):
    save_checkpoint(tmp_path, 5, {"run_id": "old", "step": 5})
    with caplog.at_level(logging.WARNING):
        assert resume_or_restart(tmp_path, "new", key="run_id", covers="params, data or code") is None
    assert "was made with other params, data or code: starting over" in caplog.text
    assert list_checkpoints(tmp_path) == []


def test_a_checkpoint_whose_code_was_identified_by_bytes_starts_over_once_saying_why(tmp_path, caplog):
    """Checkpoints from before code fingerprints by meaning hold a bare sha256 of the files' bytes."""
    from distillpipe.identity import code_identity, stage_code
    from distillpipe.train.build import CODE_STAGES

    new = {**IDENTITY, "code": code_identity(stage_code(*CODE_STAGES, student="waldorf"))}
    save_checkpoint(tmp_path, 5, {"identity": {**IDENTITY, "code": "4c5c" * 16}, "step": 5})
    with caplog.at_level(logging.WARNING):
        assert resume_or_restart(tmp_path, new, key="identity") is None
    assert "made with other code (identified by its files' bytes before code fingerprints by meaning" in caplog.text
    save_checkpoint(tmp_path, 6, {"identity": new, "step": 6})
    assert resume_or_restart(tmp_path, new, key="identity")["step"] == 6


def test_a_checkpoint_without_identity_is_from_an_older_version(tmp_path, caplog):
    save_checkpoint(tmp_path, 5, {"step": 5})
    with caplog.at_level(logging.WARNING):
        assert resume_or_restart(tmp_path, IDENTITY, key="identity") is None
    assert "other identity (a checkpoint of an older version)" in caplog.text


def test_only_the_main_process_removes_and_only_after_the_barrier(tmp_path, caplog):
    save_checkpoint(tmp_path, 5, {"identity": {**IDENTITY, "params": "p0"}, "step": 5})
    seen = []
    with caplog.at_level(logging.WARNING):
        assert resume_or_restart(tmp_path, IDENTITY, key="identity", main=False,
                                 barrier=lambda: seen.append(len(list_checkpoints(tmp_path)))) is None
    assert seen == [1] and len(list_checkpoints(tmp_path)) == 1 and caplog.text == ""  # another rank: no removal
    assert resume_or_restart(tmp_path, IDENTITY, key="identity", main=True,
                             barrier=lambda: seen.append(len(list_checkpoints(tmp_path)))) is None
    assert seen == [1, 1] and list_checkpoints(tmp_path) == []  # the file was still there at the barrier
