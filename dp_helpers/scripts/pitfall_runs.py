"""A classic DDP mistake run for real next to its fix (notebook 07's gallery).

Case: module-prefix (saving the DDP wrapper's state_dict instead of model.module's). Uneven inputs and
a collective inside `if rank == 0:` are notebook 06's plain-torch pitfalls.py; an unused parameter's hang
is notebook 04's (scripts/from_scratch.py).
"""

from __future__ import annotations

import argparse

from dp_helpers.tool import dist as dph
from dp_helpers.tool.models import build_model


def module_prefix(info: dph.DistInfo) -> dict:
    """Load the wrapper's state_dict into a plain model (fails), then model.module's (works)."""
    model, plain = dph.wrap_ddp(build_model("linear", 10, seed=0).to(info.device), info), build_model("linear", 10, seed=1)
    try:
        plain.load_state_dict(model.state_dict())
        error = ""
    except RuntimeError as exc:
        error = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())  # every line torch wrote
    plain.load_state_dict(model.module.state_dict())
    return {"wrapper_keys": list(model.state_dict()), "error": error, "module_keys": list(model.module.state_dict())}


CASES = {"module-prefix": module_prefix}


def main(info: dph.DistInfo) -> None:
    """Run the chosen cases on every rank; rank 0 writes <case>.json as each finishes."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=sorted(CASES), nargs="+", required=True)
    args = parser.parse_args()
    for name in args.case:  # several in one launch: the process start-up is paid once
        dph.gather_to_file(info, CASES[name](info), f"{name}.json")


if __name__ == "__main__":
    dph.worker(main)
