"""Checkpoints: the resume-or-restart decision the three training loops share (students, teacher_finetune,
qg_finetune), on identities of both shapes they use; a full disk: one message with the space needed, the
older checkpoints untouched, no partial file; and no checkpoint unpickled: a crafted pickle is refused with one
message and runs no code, one of an older version starts the run over, a damaged one falls back; the Checkpointer:
due by a (fake) clock, staged so training may go on, tied tensors kept tied, one write in flight, a full disk raised
in the training thread, a write SIGKILLed mid-file leaves the previous checkpoint, and SIGKILLs at random moments of a
run (at different steps by construction, on any machine) each resume where the kill left the run, and end at the
uninterrupted weights."""

import errno
import logging
import os
import pickle
import random
import re
import threading

import numpy as np
import pytest
import torch
import typer
from _fulldisk import FullDisk

from distillpipe.checkpoints import (
    Checkpointer,
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


class FakeClock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_checkpoints_are_due_by_the_clock_and_written_in_the_background(tmp_path):
    """Steps of 25 s and a 1-minute interval: due at the first step 60 s after the last checkpoint began (steps 3,
    6, 9, ...: 75 s each), whatever the step count; what is written is the state as it was when saved, though the
    caller changes its tensors at once."""
    clock, folder = FakeClock(), tmp_path / "ckpt"
    w = torch.zeros(1000)
    saved = {}
    with Checkpointer(folder, 1.0, clock=clock) as ck:
        for step in range(1, 11):
            clock.t += 25
            w += 1  # the training step, in place as an optimizer does
            if ck.due():
                ck.save(step, {"w": w, "step": step})
                saved[step] = w.clone()
                w += 1000  # changed right away: the staged copy must not see it
    assert ck.saved == list(saved) == [3, 6, 9]
    assert [p.name for p in list_checkpoints(folder)] == ["step-000000006.pt", "step-000000009.pt"]
    for step in (6, 9):
        state = torch.load(folder / f"step-{step:09d}.pt", weights_only=True)
        assert state["step"] == step and torch.equal(state["w"], saved[step])
    every = Checkpointer(tmp_path / "every", 0, clock=clock)
    assert every.due() and every.due()  # 0: every step, with no time passing


def test_staged_state_keeps_tied_tensors_tied(tmp_path):
    w = torch.randn(100, 50)
    with Checkpointer(tmp_path, 0) as ck:
        ck.save(1, {"model": {"emb": w, "decoder": w}, "other": w[:10]})
    state = torch.load(tmp_path / "step-000000001.pt", weights_only=True)
    assert state["model"]["emb"].untyped_storage().data_ptr() == state["model"]["decoder"].untyped_storage().data_ptr()
    assert torch.equal(state["model"]["emb"], w) and torch.equal(state["other"], w[:10])
    assert (tmp_path / "step-000000001.pt").stat().st_size < 1.4 * (w.numel() * 4)  # the tied pair written once


def test_a_full_disk_in_the_background_stops_the_training_thread_with_one_message(tmp_path):
    clock, folder = FakeClock(), tmp_path / "ckpt"
    ck = Checkpointer(folder, 1.0, clock=clock)
    ck.save(1, _state(1))
    ck.wait()
    with FullDisk(folder, 4096) as disk:
        ck.save(2, _state(2))  # returns at once: the write fails on its thread
        ck._thread.join()
        with pytest.raises(DiskFull, match=re.escape(f"writing checkpoint {folder / 'step-000000002.pt'}: it needs ~")):
            ck.due()  # the training thread's next question raises it
    assert disk.failed and [p.name for p in folder.iterdir()] == ["step-000000001.pt"]
    ck.wait()  # raised once, not again
    assert load_latest(folder)["step"] == 1


def test_a_second_checkpoint_waits_for_the_write_in_flight(tmp_path, monkeypatch):
    """Never two writes at once: save() of the next checkpoint returns only after the previous file is complete."""
    import distillpipe.checkpoints as checkpoints

    release, order = threading.Event(), []
    original = checkpoints.save_checkpoint

    def slow(folder, step, state, keep=2):
        order.append(("start", step))
        if step == 1:
            release.wait(10)
        path = original(folder, step, state, keep)
        order.append(("done", step))
        return path

    monkeypatch.setattr(checkpoints, "save_checkpoint", slow)
    ck = Checkpointer(tmp_path, 0)
    ck.save(1, _state(1))
    second = threading.Thread(target=ck.save, args=(2, _state(2)))
    second.start()
    second.join(0.3)
    assert second.is_alive() and order == [("start", 1)]  # held until the first write is done
    release.set()
    second.join(10)
    ck.wait()
    assert order == [("start", 1), ("done", 1), ("start", 2), ("done", 2)]


# A checkpoint's background write that is SIGKILLed half-way through its file: the driver slows the writes of step 2's
# file down, says when half of it is out, and the test kills the process there while its training thread runs on.
KILL_MID_FILE = """
import builtins, io, os, sys, time
import torch
from distillpipe.checkpoints import Checkpointer
folder, marker = sys.argv[1], sys.argv[2]
real_open = io.open
class Slow:
    def __init__(self, f):
        self.f, self.n = f, 0
    def write(self, data):
        self.n += memoryview(data).nbytes
        if self.n > 4_000_000:
            open(marker, "w").close()
            time.sleep(60)
        return self.f.write(data)
    def __getattr__(self, name):
        return getattr(self.f, name)
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        return self.f.__exit__(*exc)
def slow_open(file, mode="r", *a, **k):
    f = real_open(file, mode, *a, **k)
    return Slow(f) if "step-000000002" in str(file) and "w" in mode else f
ck = Checkpointer(folder, 0)
state = {"w%d" % i: torch.full((250_000,), float(i)) for i in range(8)}
ck.save(1, {**state, "step": 1})
ck.wait()
builtins.open = io.open = slow_open
ck.save(2, {**{k: v + 1 for k, v in state.items()}, "step": 2})
while True:  # training goes on
    torch.randn(100, 100) @ torch.randn(100, 100)
"""


def test_a_background_write_killed_mid_file_leaves_the_previous_checkpoint_usable(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    folder, marker = tmp_path / "ckpt", tmp_path / "half-written"
    proc = subprocess.Popen([sys.executable, "-c", KILL_MID_FILE, str(folder), str(marker)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert marker.exists(), proc.communicate()[0] if proc.poll() is not None else "the driver never got half-way"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    partial = folder / "step-000000002.pt.partial"
    assert partial.stat().st_size > 3_000_000  # torn: half of step 2's file
    state = load_latest(folder)
    assert state["step"] == 1 and all(torch.equal(state[f"w{i}"], torch.full((250_000,), float(i))) for i in range(8))
    assert not partial.exists() and [p.name for p in folder.iterdir()] == ["step-000000001.pt"]


# A small training loop that checkpoints the way the stages do (model, optimizer, scheduler, RNG states, the position
# in the epoch; resume_or_restart; a Checkpointer, here after every step). Run with a folder it checkpoints and resumes
# there, prints the step it starts from, and with a pause "<step>:before" or "<step>:after" stops at that step, before
# or after handing its checkpoint to the background writer, says so and waits on stdin (for the SIGKILL); with "-"
# it is the uninterrupted reference, with no checkpoint code at all.
TOY_TRAINING = """
import sys
import torch
from distillpipe.checkpoints import Checkpointer, resume_or_restart
from distillpipe.runtime import rng_state, seed_everything, set_rng_state

def train(folder, steps=60, pause=None):
    seed_everything(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Dropout(0.2), torch.nn.ReLU(),
                                torch.nn.Linear(256, 64))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1 - s / steps)
    x, y = torch.randn(960, 64, generator=torch.Generator().manual_seed(1)), torch.randn(960, 64)
    step, pos = 0, 0
    ck = None
    if folder != "-":
        state = resume_or_restart(folder, "toy", key="run_id")
        if state is not None:
            model.load_state_dict(state["model"]), opt.load_state_dict(state["optimizer"])
            sched.load_state_dict(state["scheduler"]), set_rng_state(state["rng"])
            step, pos = state["step"], state["pos"]
        ck = Checkpointer(folder, 0)
        print(f"from {step}", flush=True)
    at, where = pause.split(":") if pause else (None, None)
    while step < steps:
        order = torch.randperm(960, generator=torch.Generator().manual_seed(step // 30))  # an epoch: 30 batches
        idx = order[pos * 32:(pos + 1) * 32]
        loss = ((model(x[idx]) - y[idx]) ** 2).mean()
        loss.backward()
        opt.step(), sched.step(), opt.zero_grad()
        step, pos = step + 1, (pos + 1) % 30
        for moment in ("before", "after"):
            if str(step) == at and moment == where:
                print(f"paused {step}:{where}", flush=True)
                sys.stdin.readline()  # the test kills the process here
            if moment == "before" and ck is not None and ck.due():
                ck.save(step, {"run_id": "toy", "model": model.state_dict(), "optimizer": opt.state_dict(),
                               "scheduler": sched.state_dict(), "rng": rng_state(), "step": step, "pos": pos})
    if ck is not None:
        ck.wait()
    return model.state_dict()

if __name__ == "__main__":
    weights = train(sys.argv[1], pause=sys.argv[3] if len(sys.argv) > 3 else None)
    torch.save(weights, sys.argv[2])
"""


@pytest.mark.slow  # ~20-30 s on 2 busy cores: 5 processes, each importing torch
def test_sigkill_at_random_moments_then_resume_equals_the_uninterrupted_weights(tmp_path):
    """Four SIGKILLs at random moments of a 60-step run, each in another quarter of it, so at different steps by
    construction whatever the machine's speed (the run stops at the chosen step and waits for its kill), two before
    a step's checkpoint is handed to the background writer (the previous one may be in flight) and two after it (its
    own may be), plus up to 20 ms more for the writer to go on. Each rerun resumes from the newest checkpoint the
    kill left, which must be one of the two the moment allows, never from scratch; the fifth run finishes, and its
    weights are the uninterrupted run's, bit for bit."""
    import signal
    import subprocess
    import sys
    import time

    script = tmp_path / "toy_training.py"
    script.write_text(TOY_TRAINING)
    namespace: dict = {}
    exec(compile(TOY_TRAINING, str(script), "exec"), namespace)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the runs below (OMP_NUM_THREADS=1): the same float sums, bit for bit
    try:
        reference = namespace["train"]("-")
    finally:
        torch.set_num_threads(threads)

    folder, out = tmp_path / "ckpt", tmp_path / "weights.pt"
    rng = random.Random(0)
    pauses = [f"{rng.randrange(lo, lo + 10)}:{where}" for lo, where in zip((4, 19, 34, 49), ("before", "after") * 2)]

    watchdogs = []

    def run(*pause: str) -> tuple[subprocess.Popen, int]:
        proc = subprocess.Popen([sys.executable, str(script), str(folder), str(out), *pause],
                                env={**os.environ, "OMP_NUM_THREADS": "1"}, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        watchdogs.append(threading.Timer(300, proc.kill))  # a hung run fails the test (readline gets "")
        watchdogs[-1].daemon = True
        watchdogs[-1].start()
        first = proc.stdout.readline()
        assert first.startswith("from "), (first, proc.stderr.read() if proc.poll() is not None else "")
        return proc, int(first.split()[1])

    def newest() -> int:
        found = list_checkpoints(folder)
        return int(found[-1].name[5:14]) if found else 0

    starts, left = [], [0]
    for pause in pauses:
        proc, start = run(pause)
        starts.append(start)
        said = proc.stdout.readline().strip()
        assert said == f"paused {pause}", (said, proc.stderr.read())
        time.sleep(rng.uniform(0, 0.02))
        proc.send_signal(signal.SIGKILL)
        assert proc.wait() == -signal.SIGKILL
        step, where = int(pause.split(":")[0]), pause.split(":")[1]
        allowed = {step - 2, step - 1} if where == "before" else {step - 1, step}
        assert newest() in allowed, (pause, newest(), [p.name for p in folder.iterdir()])
        left.append(newest())
    proc, start = run()
    starts.append(start)
    assert proc.wait(timeout=300) == 0, proc.stderr.read()
    for watchdog in watchdogs:
        watchdog.cancel()
    assert starts == left, (pauses, starts, left)  # each run went on from where the kill left it, never from 0
    assert len(set(starts)) == len(starts) == 5, starts
    got = torch.load(out, weights_only=True)
    assert got.keys() == reference.keys() and all(torch.equal(got[k], reference[k]) for k in got)
