"""Checkpoints: the resume-or-restart decision the three training loops share (students, teacher_finetune,
qg_finetune), on identities of both shapes they use; and a full disk: one message with the space needed, the
older checkpoints untouched, no partial file."""

import logging
import re

import pytest
import torch
from _fulldisk import FullDisk

from distillpipe.checkpoints import list_checkpoints, load_latest, resume_or_restart, save_checkpoint, state_bytes
from distillpipe.errors import DiskFull


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


def test_other_errors_keep_their_type(tmp_path):
    with pytest.raises(AttributeError, match="Can't pickle local object"):
        save_checkpoint(tmp_path, 1, {"f": lambda: 0})  # not picklable: a bug, not a full disk
    assert list(tmp_path.iterdir()) == []

IDENTITY = {"params": "p1", "tokens": "t1", "code": "c1"}


def test_a_checkpoint_of_the_same_identity_is_resumed(tmp_path):
    save_checkpoint(tmp_path, 3, {"identity": dict(IDENTITY), "step": 3})
    save_checkpoint(tmp_path, 7, {"identity": dict(IDENTITY), "step": 7})
    assert resume_or_restart(tmp_path, IDENTITY, key="identity")["step"] == 7  # the newest
    save_checkpoint(tmp_path, 9, {"run_id": "abc", "step": 9})
    assert resume_or_restart(tmp_path, "abc", key="run_id")["step"] == 9
    assert resume_or_restart(tmp_path / "none", IDENTITY, key="identity") is None  # nothing to resume: no warning


def test_another_identity_starts_over_naming_what_changed(tmp_path, caplog):
    save_checkpoint(tmp_path, 5, {"identity": {**IDENTITY, "tokens": "t0", "code": "c0"}, "step": 5})
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
