"""Set up `make gpu-check`: the machine's own CUDA torch, prism-rr from this checkout.

No virtual environment: the interpreter that has the CUDA build of torch (PYTHON, often
itself a venv or conda env, whose packages a new venv would not see) runs the tests, with
this checkout and SITE on PYTHONPATH. pip is never asked for torch (the pinned CPU build
of `make test` would hide the GPU): prism-rr's other dependencies, and pytest, are
installed into SITE where this interpreter lacks them or has versions outside pyproject's
ranges. Arguments after SITE go to pip: offline, `--no-index --find-links DIR`.
"""

import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]


def _met(spec: str) -> bool:
    req = Requirement(spec)
    try:
        return req.specifier.contains(metadata.version(req.name), prereleases=True)
    except metadata.PackageNotFoundError:
        return False


def main() -> int:
    site, pip_args = sys.argv[1], sys.argv[2:]
    try:
        import torch
    except ImportError:
        sys.exit(f"{sys.executable} has no torch: run PYTHON=<a python with a CUDA build of torch> make gpu-check")
    if not torch.cuda.is_available():
        sys.exit(f"torch {torch.__version__} ({sys.executable}) sees no CUDA device: run PYTHON=<a python "
                 "with a CUDA build of torch> make gpu-check on a machine with a GPU")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    needs = [d for d in project["dependencies"] if Requirement(d).name != "torch"]
    missing = [d for d in needs + ["pytest>=8", "pytest-timeout>=2.3"] if not _met(d)]
    if missing:
        print(f"gpu-check: installing into {site}: {', '.join(missing)}")
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--target", site, *pip_args, *missing],
                       check=True)
    print(f"gpu-check: torch {torch.__version__} (CUDA {torch.version.cuda}) on {torch.cuda.get_device_name()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
