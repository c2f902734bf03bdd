"""Set up `make gpu-check`: the machine's own CUDA torch, prism-rr from this checkout.

No virtual environment: the interpreter that has the CUDA build of torch (PYTHON, often
itself a venv or conda env, whose packages a new venv would not see) runs the tests, with
this checkout and SITE on PYTHONPATH. pip is never asked for torch (the pinned CPU build
of `make test` would hide the GPU): prism-rr's other dependencies, and pytest, are
installed into SITE where this interpreter lacks them or has versions outside pyproject's
ranges. Arguments after SITE go to pip: offline, `--no-index --find-links DIR`.
"""

import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _name(spec: str) -> str:
    return re.split(r"[<>=!~;\[ ]", spec, maxsplit=1)[0]


def _met(spec: str) -> bool:
    """Installed, in pyproject's range where `packaging` is there to read it."""
    try:
        version = metadata.version(_name(spec))
    except metadata.PackageNotFoundError:
        return False
    try:
        from packaging.requirements import Requirement
    except ImportError:  # present is enough
        return True
    return Requirement(spec).specifier.contains(version, prereleases=True)


def _dependencies() -> list[str]:
    """pyproject's [project] dependencies (tomllib from Python 3.11; a plain reading before)."""
    text = (ROOT / "pyproject.toml").read_text()
    try:
        import tomllib
    except ImportError:  # Python 3.10
        block = re.search(r"(?ms)^dependencies = \[(.*?)^\]", text)
        return re.findall(r'"([^"]+)"', block.group(1)) if block else []
    return tomllib.loads(text)["project"]["dependencies"]


def main() -> int:
    site, pip_args = sys.argv[1], sys.argv[2:]
    try:
        import torch
    except ImportError:
        sys.exit(f"{sys.executable} has no torch: run PYTHON=<a python with a CUDA build of torch> make gpu-check")
    if not torch.cuda.is_available():
        sys.exit(f"torch {torch.__version__} ({sys.executable}) sees no CUDA device: run PYTHON=<a python "
                 "with a CUDA build of torch> make gpu-check on a machine with a GPU")
    needs = [d for d in _dependencies() if _name(d) != "torch"]
    missing = [d for d in needs + ["pytest>=8", "pytest-timeout>=2.3"] if not _met(d)]
    if missing:
        print(f"gpu-check: installing into {site}: {', '.join(missing)}")
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--target", site, *pip_args, *missing],
                       check=True)
    print(f"gpu-check: torch {torch.__version__} (CUDA {torch.version.cuda}) on {torch.cuda.get_device_name()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
