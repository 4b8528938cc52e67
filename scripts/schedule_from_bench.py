"""Re-choose a profile's schedule from a bench report it already has, with no new timing: what
``skipsearch bench --batch-sizes ... --write-measured`` keeps (``skipsearch.bench.batched.measured_schedule``), for a
profile benched before that rule or benched by someone else, or for several runs of the same bench: then each K
counts at its worst run, and a K ships only where it beat plain batched decoding in every run.

    python scripts/schedule_from_bench.py PROFILE BENCH.json [BENCH2.json ...] [--out PATH]

PROFILE must be the one each report's batched section benched (its path as the report names it). Without --out the
profile is replaced (it is the ask to); bad input is one line and exit 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from skipsearch.bench import report as br
from skipsearch.bench.batched import measured_schedule
from skipsearch.files.errors import ProfileError
from skipsearch.profile import load_profile, save_profile


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile")
    ap.add_argument("reports", nargs="+", metavar="report",
                    help="bench --json-out reports with a batched section (several: runs of the same bench)")
    ap.add_argument("--out", help="write the profile here (default: replace PROFILE)")
    args = ap.parse_args(argv)
    try:
        sections = []
        for report in args.reports:
            section = br.batched_section(br.read_report_json(Path(report).read_text()))
            if section is None:
                raise ValueError(f"{report}: the report has no batched section (bench ran without --batch-sizes)")
            if Path(section.profile).resolve() != Path(args.profile).resolve():
                raise ValueError(f"{report} benched {section.profile}, not {args.profile}")
            sections.append(section)
        prof = load_profile(args.profile)
        schedule = measured_schedule(sections, prof.schedule)
        out = save_profile(dataclasses.replace(prof, schedule=schedule), Path(args.out or args.profile))
    except (OSError, ValueError, ProfileError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"schedule: {schedule.describe()}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
