"""Checkpoints on a full disk: one message with the space needed, the older checkpoints untouched, no partial file."""

import re

import pytest
import torch
from _fulldisk import FullDisk

from distillpipe.checkpoints import list_checkpoints, load_latest, save_checkpoint, state_bytes
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
