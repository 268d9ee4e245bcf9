"""The report against the trivial baseline: the baseline per split against naive counts (the majority share by
Counter, the unanswerable share of SQuAD v2), the low ends against the main table's intervals, the yes/no rule and
the count of students above; each comparison's "Resolves" against its printed interval; intervals drawn once."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from distillpipe.evaluate import intervals
from distillpipe.evaluate.report import TableSpec, render_results

from .test_report import BOOT, _noisy, _run, _tables

SECTION = "Against the trivial baseline"


def _records(gold, pred):
    return [{"id": f"e{i}", "gold": int(g), "pred": int(p)} for i, (g, p) in enumerate(zip(gold, pred))]


def _scored(run, gold, pred, *, teacher=None, teacher_name="polarity-teacher"):
    """A classification run on polarity scored on every split of ``gold`` ({split: labels}) by accuracy, its metrics
    agreeing with its records; ``teacher``: its teacher's predictions by split."""
    r = _run(run, "cmow_hybrid", "polarity", None, None, 1000.0, 100.0)
    r["predictions"] = {"student": {}, "teacher": {"name": teacher_name}}
    r["teacher"]["name"] = teacher_name
    for split, g in gold.items():
        r[split] = {"accuracy": float(np.mean(g == pred[split]))}
        r["predictions"]["student"][split] = _records(g, pred[split])
        if teacher is not None:
            r["teacher"][split] = {"accuracy": float(np.mean(g == teacher[split]))}
            r["predictions"]["teacher"][split] = _records(g, teacher[split])
    return r


def _interval(cell: str) -> tuple[float, float, float]:
    """``71.0 [66.2, 75.4]`` -> (71.0, 66.2, 75.4)."""
    value, rest = cell.split(" [")
    low, high = rest.rstrip("]").split(", ")
    return float(value), float(low), float(high)


def _render(tmp_path, results, tables=()):
    return render_results(results, list(tables), bootstrap=BOOT, out_md=tmp_path / "r.md", out_png=tmp_path / "r.png")


def test_classification_rows_against_the_majority_share_of_each_split(tmp_path):
    rng = np.random.default_rng(7)
    gold = {"dev": (rng.random(300) < 0.65).astype(int), "test": (rng.random(200) < 0.3).astype(int)}
    majority = {s: Counter(g.tolist()).most_common(1)[0] for s, g in gold.items()}  # (class, count)
    assert majority["dev"][0] == 1 and majority["test"][0] == 0  # the two splits' majorities differ
    strong = {s: _noisy(g, 0.95, i) for i, (s, g) in enumerate(gold.items())}
    guess = {s: np.full(len(g), majority[s][0]) for s, g in gold.items()}  # the baseline itself
    teacher = {s: _noisy(g, 0.9, 10 + i) for i, (s, g) in enumerate(gold.items())}
    text = _render(tmp_path, [_scored("strong", gold, strong, teacher=teacher), _scored("guess", gold, guess)])

    main = {r["Run"]: r for r in _tables(text)["All runs"]}
    rows = {r["Run"]: r for r in _tables(text)[SECTION]}
    assert list(rows) == list(main) == ["teacher:polarity", "strong", "guess"]  # one row per main-table row
    for run, row in rows.items():
        assert row["Metric"] == "accuracy"
        assert row["Baseline"] == ("dev: the majority class (1) for every example; "
                                   "test: the majority class (0) for every example")
        for split, head in (("dev", "Dev"), ("test", "Test")):
            share = 100 * majority[split][1] / len(gold[split])
            assert row[f"{head}: baseline"] == f"{share:.1f}"
            _, low, _ = _interval(main[run][head])
            assert row[f"{head}: low"] == f"{low:.1f}"  # the main table's interval
            assert abs(low - share) > 0.1  # far enough apart that rounding cannot decide the answer
            assert row[f"{head}: clearly above?"] == ("yes" if low > share else "no")
    assert [rows[r]["Dev: clearly above?"] for r in rows] == ["yes", "yes", "no"]
    assert [rows[r]["Test: clearly above?"] for r in rows] == ["yes", "yes", "no"]
    # the constant predictor scores exactly the baseline; its interval's low end is below it
    assert main["guess"]["Dev"].split()[0] == rows["guess"]["Dev: baseline"]
    assert "1 of 2 students are clearly above their trivial baseline on both dev and test." in text
    assert text.index("## All runs") < text.index(f"## {SECTION}") < text.index("## Speed vs quality")


def test_qa_rows_against_the_unanswerable_share_and_rows_without_a_baseline(tmp_path):
    rng = np.random.default_rng(3)
    has = rng.random(250) < 0.6

    def qa_run(run, f1):
        em = (f1 >= 1.0).astype(float)
        recs = [{"id": f"q{i}", "has_answer": bool(h), "em": float(e), "f1": float(f)}
                for i, (h, e, f) in enumerate(zip(has, em, f1))]
        r = _run(run, "waldorf", "wiki_qa", {"f1": 100 * float(np.mean(f1)), "exact": 100 * float(np.mean(em))},
                 None, 900.0, 300.0, task_type="qa", primary="f1")
        r["predictions"] = {"student": {"dev": recs}, "teacher": {"name": "wiki_qa-teacher"}}
        return r

    abstain = np.where(has, 0.0, 1.0)  # the null answer everywhere: right exactly on the unanswerable questions
    reader = np.where(has, rng.uniform(0.5, 1.0, len(has)).round(1), (rng.random(len(has)) < 0.95).astype(float))
    corpus = _run("mlm", "cmow_hybrid", "wiki", {"mlm_accuracy": 0.3}, None, 500.0, 100.0, task_type="corpus",
                  primary="mlm_accuracy")
    text = _render(tmp_path, [qa_run("reader", reader), qa_run("abstain", abstain), corpus])

    main = {r["Run"]: r for r in _tables(text)["All runs"]}
    rows = {r["Run"]: r for r in _tables(text)[SECTION]}
    share = 100 * sum(not h for h in has.tolist()) / len(has)  # QA metrics are in percent already: no x100
    for run in ("reader", "abstain"):
        row = rows[run]
        assert (row["Metric"], row["Baseline"]) == ("f1", "no answer for every question")
        assert row["Dev: baseline"] == f"{share:.1f}"
        _, low, _ = _interval(main[run]["Dev"])
        assert row["Dev: low"] == f"{low:.1f}" and abs(low - share) > 0.1
        assert row["Dev: clearly above?"] == ("yes" if low > share else "no")
        assert (row["Test: baseline"], row["Test: low"], row["Test: clearly above?"]) == ("n/a", "n/a", "n/a")
    assert (rows["reader"]["Dev: clearly above?"], rows["abstain"]["Dev: clearly above?"]) == ("yes", "no")
    assert main["abstain"]["Dev"].split()[0] == f"{share:.1f}"
    # an MLM corpus has no trivial predictor; the teachers here have no records
    for run in ("mlm", "teacher:wiki", "teacher:wiki_qa"):
        assert set(rows[run].values()) - {run, rows[run]["Metric"]} == {"n/a"}
    # no test split: not clearly above on both; the MLM run is not counted
    assert "0 of 2 students are clearly above their trivial baseline on both dev and test." in text
    assert "2 of the 2 have no interval on dev or test" in text and "Not counted: 1 without a baseline" in text


def test_resolves_is_half_the_printed_interval_of_each_difference(tmp_path):
    rng = np.random.default_rng(0)
    gold = {"dev": rng.integers(0, 2, 300), "test": rng.integers(0, 2, 200)}
    teacher = {s: _noisy(g, 0.9, 3 + i) for i, (s, g) in enumerate(gold.items())}
    kd = _scored("kd", gold, {s: _noisy(g, 0.85, 1 + i) for i, (s, g) in enumerate(gold.items())}, teacher=teacher)
    hard = _scored("hard", gold, {s: _noisy(g, 0.8, 5 + i) for i, (s, g) in enumerate(gold.items())})
    spec = TableSpec(title="KD vs hard", runs=["teacher:polarity", "kd", "hard", "absent"], paper=None, caption="",
                     metric=None, compare=[("kd", "hard"), ("teacher:polarity", "kd"), ("kd", "absent")])
    text = _render(tmp_path, [kd, hard], [spec])
    comparisons = _tables(text, which=1)["KD vs hard"]
    assert [(c["Comparison"], c["Split"]) for c in comparisons] == [
        ("kd - hard", "dev"), ("kd - hard", "test"), ("teacher:polarity - kd", "dev"),
        ("teacher:polarity - kd", "test"), ("kd - absent", "")]
    for c in comparisons[:-1]:
        low, high = (float(x) for x in c["95% CI"].strip("[]").split(","))
        assert c["Resolves"].startswith("±")
        # both ends and the half-width are rounded to one decimal on their own
        assert float(c["Resolves"][1:]) == pytest.approx((high - low) / 2, abs=0.1 + 1e-9)
    # on a proportion's difference: about 1.96 standard errors of the paired difference
    c = comparisons[0]
    a, b = (np.asarray([r["pred"] for r in x["predictions"]["student"]["dev"]]) == gold["dev"] for x in (kd, hard))
    se = 100 * np.std(a.astype(float) - b.astype(float)) / np.sqrt(len(a))
    assert float(c["Resolves"][1:]) == pytest.approx(1.96 * se, rel=0.25)
    assert (comparisons[-1]["Difference"], comparisons[-1]["Resolves"]) == ("not run", "")
    assert "Resolves: half the width of the difference's interval" in text


def test_each_interval_is_drawn_once_and_two_teachers_of_a_dataset_keep_their_own(tmp_path, monkeypatch):
    drawn = []
    real = intervals.interval

    def counting(*args, **kwargs):
        drawn.append(kwargs["key"])
        return real(*args, **kwargs)

    monkeypatch.setattr(intervals, "interval", counting)
    rng = np.random.default_rng(1)
    gold = {"dev": rng.integers(0, 2, 200)}
    a = _scored("a", gold, {"dev": _noisy(gold["dev"], 0.8, 1)}, teacher={"dev": _noisy(gold["dev"], 0.95, 2)},
                teacher_name="good-teacher")
    b = _scored("b", gold, {"dev": _noisy(gold["dev"], 0.7, 3)}, teacher={"dev": _noisy(gold["dev"], 0.6, 4)},
                teacher_name="weak-teacher")
    spec = TableSpec(title="t", runs=["teacher:polarity", "a", "b"], paper=None, caption="", metric=None)
    text = _render(tmp_path, [a, b], [spec])
    # the main table, the baseline section and the spec table all quote dev intervals: each drawn once per model
    assert sorted(drawn) == sorted(["teacher:polarity/dev/accuracy"] * 2 + ["a/dev/accuracy", "b/dev/accuracy"])
    main = _tables(text)["All runs"]
    teachers = [r for r in main if r["Run"] == "teacher:polarity"]
    assert [t["Model"] for t in teachers] == ["good-teacher", "weak-teacher"]
    for t, r in zip(teachers, (a, b)):
        value, low, high = _interval(t["Dev"])
        assert value == pytest.approx(100 * r["teacher"]["dev"]["accuracy"], abs=0.05) and low < value < high
    lows = [r["Dev: low"] for r in _tables(text)[SECTION] if r["Run"] == "teacher:polarity"]
    assert lows == [f"{_interval(t['Dev'])[1]:.1f}" for t in teachers]
