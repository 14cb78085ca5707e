"""``python -m tilefuse.fuzz --graphs N --seed S [--schedules default|random|both] [--out DIR]``
runs a differential fuzzing campaign; ``--replay FILE`` re-checks a saved repro. The exit
status is 1 when any check failed."""

from __future__ import annotations

import argparse
import sys

from tilefuse.fuzz.campaign import SCHEDULE_MODES, replay, run_campaign
from tilefuse.fuzz.generator import GeneratorConfig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tilefuse.fuzz", description=__doc__)
    parser.add_argument("--graphs", type=int, default=200, help="how many graphs to generate")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--schedules", choices=SCHEDULE_MODES, default="both",
                        help="check with default schedules, random valid ones, both, or alternate "
                             "(even graphs default, odd random)")
    parser.add_argument("--max-ops", type=int, default=GeneratorConfig.max_ops)
    parser.add_argument("--max-elements", type=int, default=GeneratorConfig.max_elements)
    parser.add_argument("--specials", type=float, default=0.0,
                        help="fraction of float inputs set to NaN/+Inf/-Inf (default none)")
    parser.add_argument("--out", help="directory for shrunk repros (fail-<index>-*.graph)")
    parser.add_argument("--replay", help="re-check one saved repro instead")
    args = parser.parse_args(argv)
    if args.replay:
        verdict = replay(args.replay)
        print(f"{verdict.kind} {verdict.stage}\n{verdict.detail}".rstrip())
        return 1 if verdict.failed else 0
    config = GeneratorConfig(max_ops=args.max_ops, max_elements=args.max_elements)
    report = run_campaign(args.graphs, args.seed, schedules=args.schedules, config=config,
                          out_dir=args.out, specials=args.specials,
                          log=lambda line: print(line, flush=True))
    print(report.summary())
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
