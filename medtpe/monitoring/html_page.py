"""The monitoring report as one self-contained HTML page for a governance committee: each
task's verdict in words, its tables, and its plots (matplotlib PNGs embedded as data URIs; no
script, no network asset), each with what it shows and what it does not."""

from __future__ import annotations

import base64
import io
from collections.abc import Callable, Sequence
from html import escape
from typing import Any

import matplotlib
from matplotlib.figure import Figure

STYLE = """
body{font-family:system-ui,sans-serif;max-width:72rem;margin:2rem auto;padding:0 1rem;color:#222}
table{border-collapse:collapse;font-size:.85rem;margin:.5rem 0 1.5rem}
td,th{border:1px solid #ccc;padding:.2rem .45rem;text-align:right}
th{background:#f2f2f2} td:first-child,th:first-child{text-align:left}
.verdict{border-left:.4rem solid #b00;background:#fff4f4;padding:.6rem 1rem;font-size:1.05rem}
.verdict.ok{border-color:#070;background:#f2fff2}
figure{margin:1rem 0 2rem} figcaption{font-size:.9rem;max-width:60rem}
img{max-width:100%}
"""
PLAIN_TEXT = {"text.parse_math": False, "text.usetex": False}
"""matplotlib's settings while a figure is made and drawn: every text (a site's or a subgroup's
name in a tick label, a title, a legend) is drawn as written, never read as maths or TeX (`$\\x$`
or `$$` in a cohort attribute would otherwise stop the report)."""


def _png(figure: Figure) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode()


def _figure(title: str, draw: Callable[[Any], None], shows: str, does_not: str) -> str:
    with matplotlib.rc_context(PLAIN_TEXT):
        figure = Figure(figsize=(8, 3.4))
        axes = figure.subplots()
        draw(axes)
        axes.set_title(title, fontsize=10)
        png = _png(figure)
    return (
        f'<figure><img alt="{escape(title)}" src="data:image/png;base64,{png}">'
        f"<figcaption><b>Shows:</b> {escape(shows)} <b>Does not show:</b> {escape(does_not)}"
        "</figcaption></figure>"
    )


def _v(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}%"


def _ci(figure: dict[str, Any]) -> str:
    if figure["value"] is None:
        return "–"
    if figure["low"] is None:
        return _v(figure["value"])
    return f"{_v(figure['value'])} [{_v(figure['low'])}, {_v(figure['high'])}]"


COLUMNS = (
    "n", "flag rate", "known / open / no label", "positives", "AUROC [95% CI]", "AUPRC [95% CI]",
    "ECE", "cal. slope / intercept", "sensitivity", "PPV", "override rate", "latency p50 / p95 ms",
)  # fmt: skip


def _cells(f: dict[str, Any]) -> list[str]:
    o, cal, lat = f["outcomes"], f["calibration"], f["latency_ms"]
    return [
        str(f["n"]),
        _pct(f["flag_rate"]),
        f"{o['known']} / {o['open']} / {o['no_label']}",
        str(o["positives"]),
        _ci(f["auroc"]),
        _ci(f["auprc"]),
        _v(f["ece"]["value"]),
        f"{_v(cal['slope'], 2)} / {_v(cal['intercept'], 2)}",
        _pct(f["sensitivity"]),
        _pct(f["ppv"]),
        _pct(f["overrides"]["override_rate"]),
        f"{_v(lat['p50'], 0)} / {_v(lat['p95'], 0)}",
    ]


def _table(first: str, rows: Sequence[tuple[str, dict[str, Any]]]) -> str:
    head = "".join(f"<th>{escape(c)}</th>" for c in (first, *COLUMNS))
    body = "".join(
        "<tr>" + "".join(f"<td>{escape(c)}</td>" for c in (name, *_cells(f))) + "</tr>"
        for name, f in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _week_ticks(axes: Any, weeks: list[dict[str, Any]]) -> None:
    """One x tick per entry of `weeks` (0, 1, ...), labelled with its ISO week."""
    labels = [w["week"] for w in weeks]
    axes.set_xticks(range(len(labels)), labels, rotation=45, ha="right", fontsize=7)


def _errorbars(axes: Any, figures: list[dict[str, Any]], name: str) -> None:
    xs = [i for i, f in enumerate(figures) if f[name]["value"] is not None]
    values = [figures[i][name]["value"] for i in xs]
    low = [values[k] - (figures[i][name]["low"] or values[k]) for k, i in enumerate(xs)]
    high = [(figures[i][name]["high"] or values[k]) - values[k] for k, i in enumerate(xs)]
    axes.errorbar(xs, values, yerr=[low, high], fmt="o-", capsize=3, label=name.upper())


def _discrimination_by_week(task: dict[str, Any]) -> str:
    weeks = task["by_week"]

    def draw(axes: Any) -> None:
        _errorbars(axes, weeks, "auroc")
        _errorbars(axes, weeks, "auprc")
        _week_ticks(axes, weeks)
        axes.axhline(0.5, color="grey", linestyle="--", linewidth=1, label="AUROC of chance")
        axes.set_ylim(0, 1)
        axes.legend(fontsize=7)

    return _figure(
        "AUROC and AUPRC by week (95% patient-level bootstrap CI)",
        draw,
        "how well p(yes) ranks patients with the outcome above those without, per ISO week of the "
        "prediction, on predictions whose outcome is known; the dashed line is chance (0.5). The "
        "AUPRC's chance level is the prevalence (see the tables).",
        "the weeks whose outcomes are still open (recent weeks lag by the task's horizon), "
        "whether the flags helped anyone, or performance at the operating threshold.",
    )


def _volume_by_week(task: dict[str, Any]) -> str:
    weeks = task["by_week"]

    def draw(axes: Any) -> None:
        axes.bar(range(len(weeks)), [w["n"] for w in weeks], color="#9cc3e6", label="predictions")
        axes.set_ylabel("predictions")
        twin = axes.twinx()
        twin.plot(range(len(weeks)), [100 * (w["flag_rate"] or 0) for w in weeks], "o-r")
        twin.set_ylabel("flag rate (%)", color="r")
        _week_ticks(axes, weeks)

    return _figure(
        "Predictions and flag rate by week",
        draw,
        "how many live predictions were made each week and the share whose p(yes) reached the "
        "operating threshold.",
        "whether a change in flag rate comes from the patients, the documentation or the model: "
        "read it with the subgroup tables and the drift metrics.",
    )


def _reliability(task: dict[str, Any]) -> str:
    curve = task["overall"]["reliability"]

    def draw(axes: Any) -> None:
        axes.plot([0, 1], [0, 1], "--", color="grey", label="perfect calibration")
        if curve:
            axes.scatter(
                [b["mean_p"] for b in curve],
                [b["observed"] for b in curve],
                s=[20 + 200 * b["n"] / max(c["n"] for c in curve) for b in curve],
                label="bins (size: n)",
            )
        axes.set_xlabel("mean predicted p(yes)")
        axes.set_ylabel("observed outcome rate")
        axes.set_xlim(0, 1)
        axes.set_ylim(0, 1)
        axes.legend(fontsize=7)

    return _figure(
        "Reliability curve (10 equal-width bins of p(yes))",
        draw,
        "for predictions with a known outcome, the observed outcome rate against the mean p(yes) "
        "in each bin; on the diagonal p(yes) can be read as a risk. ECE is the n-weighted mean "
        "gap; the slope and intercept of a logistic fit on logit(p) are 1 and 0 when calibrated.",
        "discrimination (a model can be calibrated and rank no better than chance), or "
        "calibration inside a subgroup (see the subgroup table).",
    )


def _subgroups(task: dict[str, Any]) -> str:
    groups = task["by_subgroup"]

    def draw(axes: Any) -> None:
        shown = [g for g in groups if g["auroc"]["value"] is not None]
        ys = list(range(len(shown)))
        values = [g["auroc"]["value"] for g in shown]
        low = [v - (g["auroc"]["low"] or v) for v, g in zip(values, shown, strict=True)]
        high = [(g["auroc"]["high"] or v) - v for v, g in zip(values, shown, strict=True)]
        axes.errorbar(values, ys, xerr=[low, high], fmt="o", capsize=3)
        axes.set_yticks(
            ys, [f"{g['attribute']}={g['value']} (n={g['n']})" for g in shown], fontsize=7
        )
        axes.axvline(0.5, color="grey", linestyle="--", linewidth=1)
        axes.set_xlim(0, 1)
        axes.set_xlabel("AUROC")

    return _figure(
        "AUROC by subgroup (95% CI)",
        draw,
        "discrimination within each value of each cohort attribute (sex, age band, attributes the "
        "site maps), over the whole period; subgroups whose outcomes hold one class are left out.",
        "differences in flag rate or calibration (see the table), or subgroups the ledger does "
        "not record; overlapping intervals do not prove equal performance.",
    )


def _sweep(task: dict[str, Any]) -> str:
    sweep = task["threshold_sweep"]

    def draw(axes: Any) -> None:
        ts = [s["threshold"] for s in sweep]
        axes.plot(ts, [s["alerts_per_day"] for s in sweep], "o-", label="alerts per day")
        axes.set_xlabel("threshold on p(yes)")
        axes.set_ylabel("alerts per day")
        twin = axes.twinx()
        twin.plot(ts, [s["sensitivity"] for s in sweep], "s--g", label="sensitivity")
        twin.plot(ts, [s["ppv"] for s in sweep], "^--r", label="PPV")
        twin.set_ylim(0, 1)
        twin.legend(fontsize=7, loc="upper right")
        axes.axvline(task["thresholds"]["default"], color="grey", linewidth=1)

    return _figure(
        "Alert burden against sensitivity and PPV, by threshold",
        draw,
        "for each threshold, how many alerts a day the period's live predictions would have "
        "raised and, on those with known outcomes, the share of patients with the outcome it "
        "flags (sensitivity) and the share of flags that were right (PPV); the grey line is the "
        "operating threshold.",
        "the effect of alerting on care (a flagged patient may be treated and so avoid the "
        "outcome), nor days with no prediction.",
    )


def _latency(task: dict[str, Any]) -> str:
    weeks = task["by_week"]

    def draw(axes: Any) -> None:
        axes.plot(range(len(weeks)), [w["latency_ms"]["p50"] for w in weeks], "o-", label="p50")
        axes.plot(range(len(weeks)), [w["latency_ms"]["p95"] for w in weeks], "s-", label="p95")
        axes.set_ylabel("ms")
        _week_ticks(axes, weeks)
        axes.legend(fontsize=7)

    return _figure(
        "Latency by week (p50, p95)",
        draw,
        "the time the service took to answer, as the ledger recorded it per prediction.",
        "the time a clinician waited in the EHR (network, EHR rendering), or time-outs that "
        "left no row.",
    )


def _shadow(task: dict[str, Any]) -> str:
    shadow = task["shadow"]
    if not shadow:
        return "<p>No shadow predictions in this period.</p>"

    def draw(axes: Any) -> None:
        weeks = shadow["by_week"]
        axes.plot(range(len(weeks)), [w["agreement"] for w in weeks], "o-", label="agreement")
        axes.plot(range(len(weeks)), [w["mean_abs_dp"] for w in weeks], "s-", label="mean |Δp|")
        _week_ticks(axes, weeks)
        axes.set_ylim(0, 1)
        axes.legend(fontsize=7)

    text = (
        f"<p>{shadow['n']} shadow pairs ({shadow['unpaired']} shadow rows whose original is not in "
        f"the ledger): agreement {_pct(shadow['agreement'])}, mean |Δp| "
        f"{_v(shadow['mean_abs_dp'])}, p95 |Δp| {_v(shadow['p95_abs_dp'])}.</p>"
    )
    return text + _figure(
        "Shadow agreement and |Δp| by week",
        draw,
        "for requests also answered with the original tokenizer, the share with the same answer "
        "and the mean absolute difference in p(yes).",
        "which answer was right: both may be equally wrong.",
    )


def _overrides(task: dict[str, Any]) -> str:
    overrides = task["overall"]["overrides"]
    if not overrides["feedback"]:
        return "<p>No CDS feedback recorded for these predictions.</p>"
    rows = "".join(
        f"<tr><td>{escape(reason)}</td><td>{r['n']}</td><td>{_pct(r['share_of_feedback'])}</td></tr>"
        for reason, r in overrides["by_reason"].items()
    )
    return (
        f"<p>{overrides['feedback']} cards with feedback, {overrides['overridden']} overridden "
        f"({_pct(overrides['override_rate'])}).</p><table><tr><th>override reason</th><th>n</th>"
        f"<th>share of feedback</th></tr>{rows}</table>"
    )


def _silent(task: dict[str, Any]) -> str:
    silent = task["silent"]
    if not silent:
        return "<p>No silent-mode predictions in this period.</p>"
    return (
        f"<p>{escape(silent['verdict'])}</p>"
        + _table("", [("live", task["overall"]), ("silent", silent["overall"])])
        + _table("silent, week", [(w["week"], w) for w in silent["by_week"]])
    )


def _task_section(task: dict[str, Any]) -> str:
    ok = "ok" if task["verdict"].startswith("The model discriminates") else ""
    thresholds = ", ".join(f"{escape(s)}: {t:g}" for s, t in task["thresholds"]["by_site"].items())
    return "".join(
        [
            f"<h2>{escape(task['task'])}</h2>",
            f"<p>Outcome: {escape(task['outcome'])}. Operating threshold on p(yes): "
            f"{task['thresholds']['default']:g} (by site: {thresholds or 'none'}).</p>",
            f'<p class="verdict {ok}">{escape(task["verdict"])}</p>',
            "<h3>Live predictions</h3>",
            _table("", [("all", task["overall"])]),
            _discrimination_by_week(task),
            _volume_by_week(task),
            _table("week", [(w["week"], w) for w in task["by_week"]]),
            _reliability(task),
            "<h3>Sites</h3>",
            _table("site", [(s["site"], s) for s in task["by_site"]]),
            _table("site, week", [(f"{s['site']}, {s['week']}", s) for s in task["by_site_week"]]),
            "<h3>Subgroups</h3>",
            _subgroups(task),
            _table(
                "subgroup", [(f"{g['attribute']}={g['value']}", g) for g in task["by_subgroup"]]
            ),
            "<h3>Threshold sweep (alert burden)</h3>",
            _sweep(task),
            "<h3>Overrides (CDS feedback)</h3>",
            _overrides(task),
            "<h3>Latency</h3>",
            _latency(task),
            "<h3>Silent mode</h3>",
            _silent(task),
            "<h3>Shadow (original tokenizer)</h3>",
            _shadow(task),
        ]
    )


def render_html(report: dict[str, Any]) -> str:
    """The report's page."""
    period = f"{report['since'] or 'the first prediction'} to {report['until'] or 'the last'}"
    intro = (
        f"<p>{report['predictions']} predictions, {escape(period)}. Intervals: 95% percentile "
        f"bootstrap over patients ({report['resamples']} resamples). Discrimination and "
        "calibration use only predictions whose outcome is known; an open outcome (its horizon "
        "not yet reached in the data) is counted, never guessed.</p>"
    )
    tasks = "".join(_task_section(t) for t in report["tasks"]) or "<p>No predictions.</p>"
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>Model monitoring report</title><style>{STYLE}</style></head><body>"
        f"<h1>Model monitoring report</h1>{intro}{tasks}</body></html>\n"
    )
