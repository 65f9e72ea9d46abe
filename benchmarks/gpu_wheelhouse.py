"""Build the wheelhouse the GPU machine needs: every dependency of autotune that its image lacks.

The lent GPU machine (device kind nvidia-h200) has Python 3.12 and torch, but no optuna,
sqlalchemy, alembic, colorlog or Mako, and it reaches no package index. So the wheels travel
with the check: this script, run here (where PyPI is reachable), downloads cp312 manylinux
wheels of exactly what is missing there, pinned to the versions installed here (what the test
suite ran against), and follows each wheel's own requirements until nothing is missing.
`benchmarks/gpu_check.sh` then installs them offline with `--no-index --no-deps` into a target
directory. A plain `pip download` on this machine's Python 3.11 would fetch cp311 wheels of
sqlalchemy, which the device refuses; `--python-version 3.12 --only-binary=:all:` does not.

    python benchmarks/gpu_wheelhouse.py                      # .wheelhouse/ for the GPU machine
    python benchmarks/gpu_wheelhouse.py --python-version 3.11 --out .wheelhouse-cp311   # for a dry run here
    python benchmarks/gpu_wheelhouse.py --check              # resolve only, print what would be fetched
    python benchmarks/gpu_wheelhouse.py --verify             # is .wheelhouse/ complete for the machine?

What the machine already has is `benchmarks/gpu_device_packages.txt` (the image's package list,
as the device library's KINDS.md gives it). `.wheelhouse/MANIFEST` lists what was fetched and why."""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEVICE_PACKAGES = HERE / "gpu_device_packages.txt"
# pip matches manylinux tags exactly: the glibc levels today's wheels are built for
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


def device_packages(path: Path = DEVICE_PACKAGES) -> set[str]:
    """The canonical names of the packages the GPU machine's image holds."""
    names = set()
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.add(canonicalize_name(line))
    return names


def project_requirements(pyproject: Path = ROOT / "pyproject.toml") -> list[Requirement]:
    """autotune's own runtime dependencies ([project] dependencies)."""
    import tomllib

    data = tomllib.loads(pyproject.read_text())
    return [Requirement(text) for text in data["project"]["dependencies"]]


def marker_environment(python_version: str) -> dict[str, str]:
    env = dict(default_environment())
    env.update(
        python_version=python_version,
        python_full_version=f"{python_version}.0",
        sys_platform="linux",
        platform_system="Linux",
        platform_machine="x86_64",
        os_name="posix",
        implementation_name="cpython",
        platform_python_implementation="CPython",
    )
    return env


def applies(req: Requirement, env: dict[str, str]) -> bool:
    """Whether a requirement holds on the target: its marker true there and no extra asked."""
    if req.marker is None:
        return True
    return req.marker.evaluate({**env, "extra": ""})


def pinned(name: str) -> str:
    """`name==version` as installed here (what the tests ran with), else the name alone."""
    try:
        return f"{name}=={importlib.metadata.version(name)}"
    except importlib.metadata.PackageNotFoundError:
        return name


def download(spec: str, python_version: str, dest: Path) -> Path:
    """One wheel, no dependencies, for CPython `python_version` on manylinux x86-64."""
    before = set(dest.glob("*.whl"))
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"]
    command += ["--python-version", python_version, "--implementation", "cp", "-d", str(dest)]
    for platform in PLATFORMS:
        command += ["--platform", platform]
    subprocess.run([*command, spec], check=True)
    new = set(dest.glob("*.whl")) - before
    if not new:  # already there from an earlier run
        stem = canonicalize_name(Requirement(spec).name).replace("-", "_")
        new = {w for w in dest.glob("*.whl") if canonicalize_name(w.name.split("-")[0]).replace("-", "_") == stem}
    return sorted(new)[0]


def wheel_requirements(wheel: Path) -> list[Requirement]:
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(n for n in archive.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n))
        text = archive.read(metadata).decode()
    return [
        Requirement(line.split(":", 1)[1].strip()) for line in text.splitlines() if line.startswith("Requires-Dist:")
    ]


def build(out: Path, python_version: str, have: set[str], dry: bool = False) -> list[tuple[str, str]]:
    """Fetch every requirement the device lacks, following each wheel's own requirements.
    Returns (wheel or spec, why) per package fetched."""
    env = marker_environment(python_version)
    out.mkdir(parents=True, exist_ok=True)
    todo = [(req, "autotune") for req in project_requirements()]
    seen: set[str] = set()
    fetched: list[tuple[str, str]] = []
    while todo:
        req, why = todo.pop(0)
        name = canonicalize_name(req.name)
        if name in seen or name in have or not applies(req, env):
            continue
        seen.add(name)
        spec = pinned(req.name)
        if dry:
            fetched.append((spec, why))
            continue
        wheel = download(spec, python_version, out)
        fetched.append((wheel.name, why))
        todo += [(sub, req.name) for sub in wheel_requirements(wheel)]
    return fetched


def wheel_name(wheel: Path) -> str:
    return canonicalize_name(wheel.name.split("-")[0])


def unmet(wheelhouse: Path, have: set[str], python_version: str) -> list[str]:
    """What the wheelhouse's wheels require that neither the target machine nor the wheelhouse
    holds, and wheels the target cannot install (another CPython, another platform): the
    offline `--no-deps` install would break on either. Empty when the wheelhouse is complete."""
    env = marker_environment(python_version)
    wheels = sorted(wheelhouse.glob("*.whl"))
    present = have | {wheel_name(w) for w in wheels}
    tag = f"cp{python_version.replace('.', '')}"
    problems = []
    for wheel in wheels:
        python_tag, abi_tag, platform_tag = wheel.stem.split("-")[-3:]
        if not (python_tag.startswith("py3") or python_tag == tag) or not (
            platform_tag == "any" or "manylinux" in platform_tag and platform_tag.endswith("x86_64")
        ):
            problems.append(f"{wheel.name}: not installable on CPython {python_version}, Linux x86-64")
        for req in wheel_requirements(wheel):
            if applies(req, env) and canonicalize_name(req.name) not in present:
                problems.append(f"{wheel.name} requires {req}, which is neither on the machine nor in the wheelhouse")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / ".wheelhouse")
    parser.add_argument("--python-version", default="3.12", help="the target's Python (the GPU machine: 3.12)")
    parser.add_argument("--check", action="store_true", help="resolve the first level only; download nothing")
    parser.add_argument(
        "--verify", action="store_true", help="check an existing wheelhouse is complete; download nothing"
    )
    args = parser.parse_args()
    have = device_packages()
    if args.verify:
        problems = unmet(args.out, have, args.python_version)
        print("\n".join(problems) or f"{args.out}: complete for Python {args.python_version}")
        return 1 if problems else 0
    if args.check:
        for spec, why in build(args.out, args.python_version, have, dry=True):
            print(f"{spec}\t(needed by {why})")
        return 0
    with tempfile.TemporaryDirectory() as tmp:  # fetch apart, then replace: no stale wheels mixed in
        fetched = build(Path(tmp), args.python_version, have)
        args.out.mkdir(parents=True, exist_ok=True)
        for old in args.out.glob("*.whl"):
            old.unlink()
        for wheel in Path(tmp).glob("*.whl"):
            wheel.rename(args.out / wheel.name)
    manifest = "\n".join(f"{wheel}\tneeded by {why}" for wheel, why in fetched)
    (args.out / "MANIFEST").write_text(f"# python {args.python_version}; {len(fetched)} wheels\n{manifest}\n")
    size = sum(w.stat().st_size for w in args.out.glob("*.whl"))
    print(f"{args.out}: {len(fetched)} wheels, {size / 2**20:.1f} MiB for Python {args.python_version}")
    print(manifest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
