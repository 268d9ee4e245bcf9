"""Checkpoints: the resume-or-restart decision the three training loops share (students, teacher_finetune,
qg_finetune), on identities of both shapes they use."""

import logging

from distillpipe.checkpoints import list_checkpoints, resume_or_restart, save_checkpoint

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
