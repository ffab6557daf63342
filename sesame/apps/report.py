"""``sesame report``: the training curves of runs, and of the runs inside application folders (a ``compare`` folder's
cells, ``ulmfit``'s stages, ``demo``'s runs), overlaid and labelled, against the optimizer step.

One chart per curve: training loss, learning rate, throughput (tokens/s), then every dev metric the runs record
(times and counts such as ``elapsed`` and ``n`` are not curves). The charts are drawn once, with matplotlib, into a
self-contained HTML page (inline SVG, text kept as text; no script, and a content security policy that lets the page
fetch nothing) and a PNG of the same charts beside it.
"""
from __future__ import annotations

import html
import io
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import SesameError
from ..options import option
from ..outputs import APPLICATIONS, directory_kind, new_file
from ..run import KINDS
from ..train.checkpoint import atomic_write_bytes, atomic_write_text, read_json
from ..train.metrics_log import read_metrics, scalars

if TYPE_CHECKING:
    from matplotlib.figure import Figure

FIRST = {"train/loss": "training loss", "train/lr": "learning rate", "train/tokens_per_s": "throughput (tokens/s)"}
NOT_CURVES = ("elapsed", "n", "tokens", "entities", "predicted_entities", "correct_entities")  # times and counts
STYLES = ("-", "--", ":", "-.")  # after the ten colours, the next ten runs are dashed, ...
FIX = "give run directories sesame trained, or compare folders"
# the page may load nothing from anywhere: a link or script slipped in by accident is blocked (and logged)
POLICY = "default-src 'none'; style-src 'unsafe-inline'"


@dataclass(kw_only=True)
class ReportSpec:
    """``sesame report``: the runs (or application folders) to chart, and the HTML page to write."""
    runs: list[str] = option(cli=False, metavar="RUN", help="run directories, or compare folders (every run in them)")
    out: str = option(metavar="FILE.html", help="the HTML page to write; the PNG of its charts goes beside it")


@dataclass
class Curves:
    """One run's curves: ``points[tag]`` = [(step, value), ...] for tags such as ``train/loss``, ``dev/accuracy``."""
    label: str
    path: Path
    config: dict
    points: dict[str, list[tuple[int, float]]]

    @property
    def steps(self) -> int:
        return max((step for points in self.points.values() for step, _ in points), default=0)


def _runs(given: str) -> list[tuple[str, Path]]:
    """(label, directory) of the run ``given`` names, or of every run with a log inside the application folder."""
    path = Path(given)
    if not path.is_dir():
        raise SesameError(f"RUN {given}: {'is a file' if path.exists() else 'not found'}; {FIX}")
    kind = directory_kind(path)
    if kind in KINDS:
        if not (path / "metrics.jsonl").is_file():
            raise SesameError(f"RUN {given}: has no metrics.jsonl, so sesame did not train it (an import?); {FIX}")
        return [(path.as_posix(), path)]
    if kind in APPLICATIONS:
        found = sorted(log.parent for log in path.rglob("metrics.jsonl") if directory_kind(log.parent) in KINDS)
        if not found:
            raise SesameError(f"RUN {given}: this {kind} folder holds no trained run yet; run it first, or {FIX}")
        return [(f"{path.as_posix()}/{run.relative_to(path).as_posix()}", run) for run in found]
    raise SesameError(f"RUN {given}: not a sesame run (config.json) or compare folder (sesame.json); {FIX}")


def _curves(label: str, path: Path) -> Curves:
    points: dict[str, list[tuple[int, float]]] = {}
    for record in read_metrics(path / "metrics.jsonl"):
        for tag, value in scalars(record).items():
            if tag.count("/") == 1 and tag.split("/")[1] not in NOT_CURVES:
                points.setdefault(tag, []).append((record["step"], value))
    return Curves(label, path, read_json(path / "config.json"), points)


def _tags(runs: list[Curves]) -> list[str]:
    """The charts, in order: loss, learning rate and throughput, then the other training curves, then dev's."""
    seen = list(dict.fromkeys(tag for run in runs for tag in run.points))
    return [t for t in FIRST if t in seen] + [t for t in seen if t.startswith("train/") and t not in FIRST] + \
        [t for t in seen if not t.startswith("train/")]


def _title(tag: str) -> str:
    return FIRST.get(tag) or tag.replace("/", " ").replace("_", " ")


def chart(runs: list[Curves]) -> Figure:
    """The figure: a panel per curve (its axes' SVG group id ``chart-SPLIT-NAME``), every run in its colour and style,
    one legend below."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    tags = _tags(runs)
    cols = min(2, len(tags))
    rows = -(-len(tags) // cols)
    fig = Figure(figsize=(5.5 * cols, 0.5 + 2.8 * rows + 0.22 * -(-len(runs) // 2)), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    style = {run.label: {"color": f"C{i % 10}", "linestyle": STYLES[i // 10 % len(STYLES)]} for i, run in
             enumerate(runs)}
    for ax, tag in zip(axes, tags):
        ax.set_gid(f"chart-{tag.replace('/', '-')}")
        for run in runs:
            if tag in run.points:
                steps, values = zip(*run.points[tag])
                dots = tag.startswith("dev/") or len(steps) == 1
                ax.plot(steps, values, marker="o" if dots else None, markersize=3, linewidth=1.2, **style[run.label])
        ax.set_title(_title(tag), fontsize=10)
        ax.set_xlabel("step", fontsize=8)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
    for ax in axes[len(tags):]:
        fig.delaxes(ax)
    fig.legend(handles=[Line2D([], [], label=run.label, **style[run.label]) for run in runs],
               loc="outside lower center", ncols=min(2, len(runs)), fontsize=8)
    return fig


def _page(runs: list[Curves], svg: str, png: str) -> str:
    def row(run: Curves) -> str:
        c = run.config
        cells = [run.label, c.get("kind"), " ".join(str(c[k]) for k in ("family", "size") if c.get(k)), c.get("task"),
                 run.steps]
        return "<tr>" + "".join(f"<td>{html.escape(str(cell or '—'))}</td>" for cell in cells) + "</tr>"

    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{POLICY}">
<title>sesame report: {html.escape(", ".join(run.label for run in runs))}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; margin-bottom: 1.5em; }}
th, td {{ padding: 0.2em 0.8em; border-bottom: 1px solid #ddd; text-align: left; }}
svg {{ max-width: 100%; height: auto; }}
</style>
</head>
<body>
<h1>Training curves</h1>
<table>
<tr><th>run</th><th>kind</th><th>model</th><th>task</th><th>steps</th></tr>
{chr(10).join(row(run) for run in runs)}
</table>
<figure id="charts">
{svg}
<figcaption>Against the optimizer step; dots mark dev evaluations. The same charts: {html.escape(png)}.</figcaption>
</figure>
</body>
</html>
"""


def report(spec: ReportSpec) -> dict:
    """Write the HTML page ``spec.out`` and the PNG beside it; returns their paths and the runs' labels."""
    import matplotlib

    out = Path(spec.out)
    if out.suffix != ".html":
        raise SesameError(f"--out {spec.out}: name the page FILE.html (its PNG goes beside it as FILE.png)")
    found = [pair for given in spec.runs for pair in _runs(given)]
    paths = [path.resolve() for _, path in found]
    if len(set(paths)) < len(paths):
        twice = next(label for (label, _), path in zip(found, paths) if paths.count(path) > 1)
        raise SesameError(f"RUN {twice}: given twice (itself, or inside a folder given too); give each run once")
    runs = [_curves(label, path) for label, path in found]
    if not any(run.points for run in runs):
        raise SesameError(f"RUN {' '.join(spec.runs)}: their metrics.jsonl hold no curves yet; train them first")
    png = out.with_suffix(".png")
    for path in (out, png):
        new_file(path, "--out", {"RUN": spec.runs})
    fig = chart(runs)
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "sesame"}):
        svg, image = io.StringIO(), io.BytesIO()
        fig.savefig(svg, format="svg", metadata={"Date": None})
        fig.savefig(image, format="png", dpi=110)
    inline = svg.getvalue()
    atomic_write_bytes(png, image.getvalue())
    atomic_write_text(out, _page(runs, inline[inline.index("<svg"):], png.name))
    return {"html": str(out), "png": str(png), "runs": [run.label for run in runs]}
