"""The report renderer: rows and values parsed back from the Markdown, missing runs, determinism,
and a valid PNG."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
from matplotlib import image as mpimg

from distillpipe.evaluate.report import Bootstrap, TableSpec, load_results, render_results

BOOT = Bootstrap(n_resamples=500, confidence=0.95, seed=0)


def _run(
    run,
    student,
    dataset,
    dev,
    test,
    sps,
    teacher_sps,
    *,
    task_type="classification",
    primary="accuracy",
    teacher_dev=None,
    params=(12_345_678, 123_456),
):
    return {
        "run": run,
        "student": student,
        "dataset": dataset,
        "task_type": task_type,
        "note": f"note of {run}",
        "primary_metric": primary,
        "dev": dev,
        "test": test,
        "params": {"total": params[0], "without_embeddings": params[1]},
        "speed": {
            "device": "cpu",
            "batch_size": 256,
            "seq_len": 64,
            "student_sentences_per_s": sps,
            "teacher_sentences_per_s": teacher_sps,
            "speedup": sps / teacher_sps,
        },
        "teacher": {
            "name": f"{dataset}-teacher",
            "dev": teacher_dev or {primary: 0.8},
            "test": None,
            "params": {"total": 22_700_000, "without_embeddings": 10_900_000},
        },
    }


RESULTS = [
    _run(
        "hybrid-polarity",
        "cmow_hybrid",
        "polarity",
        {"accuracy": 0.71, "f1": 0.70, "matthews": 0.42},
        {"accuracy": 0.705},
        30000.0,
        4600.0,
    ),
    _run(
        "waldorf-qa",
        "waldorf",
        "wiki_qa",
        {"exact": 34.04, "f1": 45.678, "HasAns_exact": 2.1, "NoAns_exact": 98.9, "tuned_threshold": -1.25,
         "reachable_best_f1": 45.678, "reachable_best_exact": 34.5, "best_f1": 47.04, "best_f1_thresh": 0.0,
         "best_exact": 35.0, "best_exact_thresh": 0.125},
        None,
        900.0,
        300.0,
        task_type="qa",
        primary="f1",
        teacher_dev={"exact": 50.0, "f1": 55.55},
        params=(3_000_000, 2_000_000),
    ),
    _run(
        "cbow-polarity",
        "cmow_hybrid",
        "polarity",
        {"accuracy": 0.6049, "f1": 0.6, "matthews": 0.2},
        None,
        50000.0,
        5000.0,
    ),
]
TABLES = [
    TableSpec(
        title="WaLDORf ablation",
        runs=["teacher:wiki_qa", "waldorf-qa", "waldorf-slow-build"],
        paper={"waldorf-qa": "34.0", "waldorf-slow-build": "66.0"},
        caption="EM on dev.",
        metric="exact",
    ),
    TableSpec(title="CMOW variants", runs=["cbow-polarity", "hybrid-polarity"], paper=None, caption="", metric=None),
]


def _tables(md: str, which: int = 0) -> dict[str, list[dict[str, str]]]:
    """Section title -> rows of the ``which``-th Markdown table under it (0: the main one, 1: its paired
    comparisons), as {header: cell}."""
    out: dict[str, list[dict[str, str]]] = {}
    section, header, index = None, None, -1
    for line in md.splitlines():
        if line.startswith("## "):
            section, header, index = line[3:], None, -1
        elif line.startswith("|") and section is not None:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if header is None:
                header, index = cells, index + 1
            elif not set(line) <= {"|", "-"} and index == which:
                out.setdefault(section, []).append(dict(zip(header, cells, strict=True)))
        else:
            header = None
    return out


@pytest.fixture
def rendered(tmp_path):
    md_path, png_path = tmp_path / "reports" / "results.md", tmp_path / "reports" / "speed_quality.png"
    text = render_results(RESULTS, TABLES, bootstrap=BOOT, out_md=md_path, out_png=png_path)
    return text, md_path, png_path


def test_main_table_rows_and_values(rendered):
    text, md_path, _ = rendered
    assert md_path.read_text() == text
    rows = _tables(text)["All runs"]
    # per dataset in order of appearance: its teacher, then its runs in input order
    assert [(r["Dataset"], r["Run"]) for r in rows] == [
        ("polarity", "teacher:polarity"),
        ("polarity", "hybrid-polarity"),
        ("polarity", "cbow-polarity"),
        ("wiki_qa", "teacher:wiki_qa"),
        ("wiki_qa", "waldorf-qa"),
    ]
    by = {r["Run"]: r for r in rows}
    h = by["hybrid-polarity"]
    assert (h["Model"], h["Note"], h["Metric"]) == ("cmow_hybrid", "note of hybrid-polarity", "accuracy")
    assert (h["Dev"], h["Test"]) == ("71.0", "70.5")  # fractions x100, one decimal
    assert (h["Params (M)"], h["w/o emb. (M)"]) == ("12.35", "0.12")
    assert (h["Sent./s"], h["Speed-up"], h["Device"]) == ("30,000", "6.5x", "cpu")
    assert (by["cbow-polarity"]["Dev"], by["cbow-polarity"]["Test"]) == ("60.5", "n/a")
    t = by["teacher:polarity"]
    assert (t["Model"], t["Note"], t["Dev"], t["Params (M)"], t["w/o emb. (M)"]) == (
        "polarity-teacher",
        "teacher",
        "80.0",
        "22.70",
        "10.90",
    )
    assert (t["Sent./s"], t["Speed-up"]) == ("4,800", "1.0x")  # median of 4600 and 5000
    qa = by["waldorf-qa"]
    assert (qa["Metric"], qa["Dev"], qa["Test"], qa["Speed-up"]) == ("f1", "45.7", "n/a", "3.0x")  # QA: already %
    assert by["teacher:wiki_qa"]["Dev"] == "55.5"  # 55.55 in binary is just below 55.55


def test_spec_tables_with_paper_column_and_missing_runs(rendered):
    text, _, _ = rendered
    tables = _tables(text)
    wal = tables["WaLDORf ablation"]
    assert [r["Run"] for r in wal] == ["teacher:wiki_qa", "waldorf-qa", "waldorf-slow-build"]
    assert [(r["Metric"], r["Dev"], r["Paper"]) for r in wal] == [
        ("exact", "50.0", ""),
        ("exact", "34.0", "34.0"),
        ("exact", "not run", "66.0"),
    ]
    assert wal[2]["Test"] == "not run" and wal[2]["Model"] == ""
    assert "EM on dev." in text
    cmow = tables["CMOW variants"]
    assert "Paper" not in cmow[0]
    assert [(r["Run"], r["Dev"], r["Sent./s"]) for r in cmow] == [
        ("cbow-polarity", "60.5", "50,000"),
        ("hybrid-polarity", "71.0", "30,000"),
    ]
    assert "![Speed vs quality](speed_quality.png)" in text
    assert "Speed measured on cpu with batches of 256 random sequences of length 64." in text


def test_qa_thresholds_table_names_the_applied_threshold_beside_the_official_ones(rendered):
    text, _, _ = rendered
    rows = _tables(text)["SQuAD v2 no-answer thresholds (dev)"]
    # only the QA rows that recorded thresholds (the teacher here has none)
    assert rows == [{"Run": "waldorf-qa", "Model": "waldorf", "tuned_threshold": "-1.25", "reachable_best_f1": "45.7",
                     "reachable_best_exact": "34.5", "best_f1": "47.0", "best_f1_thresh": "0",
                     "best_exact": "35.0", "best_exact_thresh": "0.125"}]
    assert "official evaluate-v2.0.py" in text
    md, png = rendered[1].with_name("no_qa.md"), rendered[2].with_name("no_qa.png")
    assert "no-answer thresholds" not in render_results(RESULTS[:1], [], bootstrap=BOOT, out_md=md, out_png=png)


def test_png_is_valid(rendered):
    _, _, png_path = rendered
    data = png_path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    img = mpimg.imread(png_path)
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
    assert np.ptp(img[..., :3]) > 0  # something was drawn


def test_rendering_is_deterministic(tmp_path):
    outs = []
    for name in ("a", "b"):
        md, png = tmp_path / name / "results.md", tmp_path / name / "speed_quality.png"
        render_results(copy.deepcopy(RESULTS), TABLES, bootstrap=BOOT, out_md=md, out_png=png)
        outs.append((md.read_bytes(), png.read_bytes()))
    assert outs[0] == outs[1]


def test_bad_inputs_are_refused(tmp_path):
    broken = copy.deepcopy(RESULTS)
    del broken[1]["speed"]
    with pytest.raises(ValueError, match=r"waldorf-qa.*'speed'"):
        render_results(broken, [], bootstrap=BOOT, out_md=tmp_path / "r.md", out_png=tmp_path / "r.png")
    with pytest.raises(ValueError, match="unique"):
        render_results(RESULTS + RESULTS[:1], [], bootstrap=BOOT, out_md=tmp_path / "r.md", out_png=tmp_path / "r.png")


def test_load_results_and_empty_speed(tmp_path):
    r = copy.deepcopy(RESULTS[0])
    r["speed"], r["teacher"], r["test"] = None, None, None
    path = tmp_path / "m.json"
    path.write_text(json.dumps(r))
    loaded = load_results([path])
    text = render_results(loaded, [], bootstrap=BOOT, out_md=tmp_path / "r.md", out_png=tmp_path / "r.png")
    row = _tables(text)["All runs"]
    assert len(row) == 1 and (row[0]["Sent./s"], row[0]["Speed-up"], row[0]["Dev"]) == ("n/a", "n/a", "71.0")
    assert "No speed was measured." in text
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match="bad.json"):
        load_results([tmp_path / "bad.json"])


def _classified(run, gold, pred, *, teacher_pred=None, dataset="polarity"):
    """A run whose metrics and predictions agree (accuracy on dev), optionally with teacher records."""
    gold, pred = np.asarray(gold), np.asarray(pred)
    records = [{"id": f"e{i}", "gold": int(g), "pred": int(p)} for i, (g, p) in enumerate(zip(gold, pred))]
    r = _run(run, "cmow_hybrid", dataset, {"accuracy": float(np.mean(gold == pred))}, None, 1000.0, 100.0)
    r["predictions"] = {"student": {"dev": records}, "teacher": {"name": f"{dataset}-teacher"}}
    if teacher_pred is not None:
        r["teacher"]["dev"] = {"accuracy": float(np.mean(gold == np.asarray(teacher_pred)))}
        r["predictions"]["teacher"]["dev"] = [{"id": f"e{i}", "gold": int(g), "pred": int(p)}
                                              for i, (g, p) in enumerate(zip(gold, teacher_pred))]
    return r


def _noisy(gold, accuracy, seed):
    rng = np.random.default_rng(seed)
    return np.where(rng.random(len(gold)) < accuracy, gold, 1 - gold)


def test_scores_carry_intervals_and_tables_their_paired_comparisons(tmp_path):
    gold = np.random.default_rng(0).integers(0, 2, 300)
    results = [_classified("kd", gold, _noisy(gold, 0.85, 1), teacher_pred=_noisy(gold, 0.9, 3)),
               _classified("hard", gold, _noisy(gold, 0.7, 2))]
    spec = TableSpec(title="KD vs hard", runs=["teacher:polarity", "kd", "hard"], paper=None, caption="",
                     metric=None, compare=[("kd", "hard"), ("teacher:polarity", "kd")])
    text = render_results(results, [spec], bootstrap=BOOT, out_md=tmp_path / "r.md", out_png=tmp_path / "r.png")
    rows = {r["Run"]: r for r in _tables(text)["All runs"]}
    for run, res in (("kd", results[0]), ("hard", results[1])):
        value, low, high = (float(x) for x in rows[run]["Dev"].replace("[", "").replace("]", "").replace(",", "")
                            .split())
        acc = 100 * res["dev"]["accuracy"]
        assert value == pytest.approx(acc, abs=0.05) and low < value < high
        # the bootstrap interval of a proportion is close to the normal approximation's +-1.96 sd
        half = 1.96 * 100 * np.sqrt(res["dev"]["accuracy"] * (1 - res["dev"]["accuracy"]) / len(gold))
        assert high - low == pytest.approx(2 * half, rel=0.25)
    assert rows["teacher:polarity"]["Dev"].count("[") == 1
    assert rows["kd"]["Test"] == "n/a"

    comparisons = _tables(text, which=1)["KD vs hard"]
    assert [(c["Comparison"], c["Split"]) for c in comparisons] == [("kd - hard", "dev"),
                                                                    ("teacher:polarity - kd", "dev")]
    c = comparisons[0]  # dev only: there are no test records
    diff = 100 * (results[0]["dev"]["accuracy"] - results[1]["dev"]["accuracy"])
    assert c["Metric"] == "accuracy" and float(c["Difference"]) == pytest.approx(diff, abs=0.05)
    low, high = (float(x) for x in c["95% CI"].strip("[]").split(","))
    assert low < float(c["Difference"]) < high
    assert (c["Test"], c["p"], c["Examples"]) == ("McNemar", "<0.001", "300")


def test_intervals_are_seeded_per_score(tmp_path):
    """The same inputs give the same report; adding a run leaves the other runs' intervals as they were."""
    gold = np.random.default_rng(0).integers(0, 2, 200)
    a = _classified("a", gold, _noisy(gold, 0.8, 1))
    b = _classified("b", gold, _noisy(gold, 0.6, 2))
    one = render_results([a], [], bootstrap=BOOT, out_md=tmp_path / "1.md", out_png=tmp_path / "1.png")
    two = render_results([a, b], [], bootstrap=BOOT, out_md=tmp_path / "2.md", out_png=tmp_path / "2.png")
    other = render_results([a], [], bootstrap=Bootstrap(500, 0.95, seed=1), out_md=tmp_path / "3.md",
                           out_png=tmp_path / "3.png")
    dev = [{r["Run"]: r["Dev"] for r in _tables(t)["All runs"]}["a"] for t in (one, two, other)]
    assert "[" in dev[0] and dev[0] == dev[1] and dev[0] != dev[2]


def test_predictions_that_disagree_with_the_metrics_are_refused(tmp_path):
    gold = np.random.default_rng(0).integers(0, 2, 100)
    stale = _classified("a", gold, _noisy(gold, 0.8, 1))
    stale["dev"]["accuracy"] += 0.05  # metrics from another evaluation than the predictions
    with pytest.raises(ValueError, match="re-run the run's evaluate stage"):
        render_results([stale], [], bootstrap=BOOT, out_md=tmp_path / "r.md", out_png=tmp_path / "r.png")


def test_comparisons_need_runs_of_the_table_and_the_same_examples(tmp_path):
    gold = np.random.default_rng(0).integers(0, 2, 100)
    a, b = _classified("a", gold, _noisy(gold, 0.8, 1)), _classified("b", gold, _noisy(gold, 0.7, 2))
    spec = TableSpec(title="t", runs=["a"], paper=None, caption="", metric=None, compare=[("a", "b")])
    with pytest.raises(ValueError, match="not among its runs"):
        render_results([a, b], [spec], bootstrap=BOOT, out_md=tmp_path / "r.md", out_png=tmp_path / "r.png")
    b["predictions"]["student"]["dev"] = b["predictions"]["student"]["dev"][:-1]  # one example fewer
    b["dev"]["accuracy"] = float(np.mean([r["gold"] == r["pred"] for r in b["predictions"]["student"]["dev"]]))
    spec = TableSpec(title="t", runs=["a", "b"], paper=None, caption="", metric=None, compare=[("a", "b")])
    with pytest.raises(ValueError, match="same examples"):
        render_results([a, b], [spec], bootstrap=BOOT, out_md=tmp_path / "r.md", out_png=tmp_path / "r.png")


def test_plot_shows_test_scores_and_marks_dev_ones(tmp_path):
    """The speed-quality plot uses test where a run has it; a run with dev only is drawn and marked."""
    from distillpipe.evaluate import report
    from distillpipe.evaluate.plot import compact, plot_speed_quality

    rows, _ = report._rows(copy.deepcopy(RESULTS))
    drawn = {p.label: p for p in plot_speed_quality(rows, report.plot_score, tmp_path / "p.png")}
    assert (drawn["hybrid-polarity"].score, drawn["hybrid-polarity"].split) == (pytest.approx(70.5), "test")
    assert drawn["cbow-polarity (dev)"].score == pytest.approx(60.49)
    assert drawn["waldorf-qa (dev)"].score == pytest.approx(45.678)  # QA metrics are percent already
    assert drawn["hybrid-polarity"].sentences_per_s == 30000.0
    assert [compact(v) for v in (50, 200, 1000, 20000, 1.5e6)] == ["50", "200", "1k", "20k", "1.5M"]


def test_overlap_between_splits_beside_the_scores(tmp_path):
    """evaluate carries the prepared dataset's leakage report into the run's metrics; the report shows it once per
    dataset, right after the scores, marking a split above the warning fraction and quoting the example."""
    from distillpipe.data.overlap import leakage_report

    leak = leakage_report({"train": [["a good film about nothing .", "the plot is dull"]],
                           "dev": [["a good film", "fun to watch"]], "test": [["nothing new", "long"]]})
    results = copy.deepcopy(RESULTS)
    results[0]["leakage"] = results[2]["leakage"] = leak
    text = render_results(results, [], bootstrap=BOOT, out_md=tmp_path / "r.md", out_png=tmp_path / "r.png")
    rows = _tables(text)["Overlap between splits"]
    assert [(r["dataset"], r["splits"], r["rows"], r["equal"], r["inside"], r["near"]) for r in rows] == [
        ("polarity", "train → dev ⚠", "2", "0", "1", "0"), ("polarity", "train → test", "2", "0", "0", "0"),
        ("polarity", "dev → test", "2", "0", "0", "0")]
    assert rows[0]["example"] == "inside: “a good film” in “a good film about nothing .”"
    assert text.index("## All runs") < text.index("## Overlap between splits") < text.index("## Speed vs quality")
    assert "## Overlap" not in render_results(RESULTS, [], bootstrap=BOOT, out_md=tmp_path / "s.md",
                                              out_png=tmp_path / "s.png")
