"""``sesame report``: flags → :class:`sesame.apps.report.ReportSpec` → :func:`sesame.apps.report.report`."""
from __future__ import annotations

import argparse
import json

from ..options import given
from . import spec_command


def add(sub: argparse._SubParsersAction) -> None:
    from ..apps.report import ReportSpec

    p = spec_command(sub, "report", ReportSpec, required=("out",), json_help="print the files written as JSON",
                     help="training curves of runs and compare folders: an HTML page and a PNG")
    p.add_argument("runs", nargs="+", metavar="RUN", help="run directories, or compare folders (every run in them)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    from ..apps.report import ReportSpec, report

    written = report(ReportSpec(**given(args, ReportSpec), runs=args.runs))
    print(json.dumps(written) if args.json else f"wrote {written['html']} and {written['png']}")
