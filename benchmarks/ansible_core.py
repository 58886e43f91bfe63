#!/usr/bin/env python3
"""The cost of one task on one host, by ansible-core release (where a converge's per-task time goes).

    python benchmarks/ansible_core.py                          # the locked release and 2.18.19
    python benchmarks/ansible_core.py --versions 2.18.19,2.19.14 --tasks 60 --hosts 3 --repeats 3

A play of --tasks `ansible.builtin.command: true` tasks on --hosts inventory hosts with the local
connection (no SSH, no network: what is left is ansible's own work per host and task, on the controller
and in the module's Python on the node), run --repeats times per release, the releases interleaved. Wall
time and CPU time (user + system of ansible-playbook and everything it started) are measured; the result
gives the median per host-task and each release's ratio to the locked one (requirements/controller.lock).
A release other than the running one is installed once into .cache/bench-ansible-core/<version> from the
configured pip index. Writes benchmarks/results/ansible-core-<UTC time>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
VENVS = REPO / ".cache" / "bench-ansible-core"


def locked_core() -> str:
    text = (REPO / "requirements" / "controller.lock").read_text()
    m = re.search(r"^ansible-core==(\S+)$", text, re.M)
    if not m:
        raise SystemExit("requirements/controller.lock pins no ansible-core")
    return m.group(1)


def running_core() -> str | None:
    try:
        from ansible.release import __version__  # type: ignore[import-not-found]
    except ImportError:
        return None
    return str(__version__)


@dataclass
class Release:
    version: str
    playbook: str  # ansible-playbook of this release
    interpreter: str = "/usr/bin/python3"  # the node's Python
    module_cache: bool = False  # the node's Python has roles/common's module bytecode cache
    runs: list[dict[str, float]] = field(default_factory=list)

    def median(self, key: str) -> float:
        return statistics.median(r[key] for r in self.runs)


def playbook_for(version: str) -> str:
    if version == running_core():
        return str(Path(sys.executable).parent / "ansible-playbook")
    venv = VENVS / version
    exe = venv / "bin" / "ansible-playbook"
    if not exe.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check",
             f"ansible-core=={version}"],
            check=True,
        )  # fmt: skip
    return str(exe)


def write_play(work: Path, tasks: int, hosts: int) -> tuple[Path, Path]:
    work.mkdir(parents=True, exist_ok=True)
    play = work / "play.yml"
    lines = ["- hosts: all", "  gather_facts: false", "  tasks:"]
    for i in range(tasks):
        lines += [
            f"    - name: task {i}",
            "      ansible.builtin.command: 'true'",
            "      changed_when: false",
        ]
    play.write_text("\n".join(lines) + "\n")
    inv = work / "inventory"
    inv.write_text("".join(f"h{i} ansible_connection=local\n" for i in range(hosts)))
    (work / "ansible.cfg").write_text("[defaults]\nforks = 20\nretry_files_enabled = false\n")
    return play, inv


def node_python(work: Path, module_cache: bool) -> str:
    """A venv of /usr/bin/python3 as the node's interpreter, with roles/common's module cache or without."""
    venv = VENVS / ("node-cache" if module_cache else "node-plain")
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)], check=True)
    if module_cache:
        site = subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True, capture_output=True, text=True,
        ).stdout.strip()  # fmt: skip
        cache = work / "module-cache"
        shutil.rmtree(cache, ignore_errors=True)
        cache.mkdir(mode=0o700, parents=True)
        template = (REPO / "roles/common/templates/lcm_module_cache.py.j2").read_text()
        hook = template.replace("{{ ansible_managed }}", "benchmarks/ansible_core.py").replace(
            "{{ _common_module_cache_dir | to_json }}", json.dumps(str(cache))
        )
        if "{{" in hook:
            raise SystemExit(
                "roles/common/templates/lcm_module_cache.py.j2 has a template expression this does not fill"
            )
        Path(site, "lcm_module_cache.py").write_text(hook)
        Path(site, "lcm-module-cache.pth").write_text("import lcm_module_cache\n")
    return str(python)


def one_run(
    playbook: str, play: Path, inv: Path, work: Path, interpreter: str = "/usr/bin/python3"
) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env |= {"ANSIBLE_CONFIG": str(work / "ansible.cfg"), "ANSIBLE_PYTHON_INTERPRETER": interpreter}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    p = subprocess.run([playbook, "-i", str(inv), str(play)], env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise SystemExit(f"{playbook} failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    lock = locked_core()
    ap.add_argument("--versions", default=f"{lock},2.18.19", help="comma-separated ansible-core releases")
    ap.add_argument("--tasks", type=int, default=60)
    ap.add_argument("--hosts", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--module-cache", action="store_true",
        help="also the locked release with roles/common's module cache on the node"
        " (both then on venvs of /usr/bin/python3)",
    )  # fmt: skip
    ap.add_argument("--results-dir", type=Path, default=RESULTS, help="where the JSON goes")
    args = ap.parse_args(argv)
    versions = [v.strip() for v in args.versions.split(",") if v.strip()]
    if lock not in versions:
        versions.insert(0, lock)
    if args.tasks < 1 or args.hosts < 1 or args.repeats < 1:
        raise SystemExit("--tasks, --hosts and --repeats must be >= 1")
    work = args.results_dir / ".ansible-core-play" if args.results_dir != RESULTS else VENVS / "play"
    play, inv = write_play(work, args.tasks, args.hosts)
    releases = [Release(v, playbook_for(v)) for v in versions]
    if args.module_cache:
        for r in releases:
            r.interpreter = node_python(work, module_cache=False)
        releases.append(
            Release(lock, playbook_for(lock), node_python(work, module_cache=True), module_cache=True)
        )
    for _ in range(args.repeats):
        for r in releases:
            r.runs.append(one_run(r.playbook, play, inv, work, r.interpreter))
            print(
                f"ansible-core {r.version}{' + module cache' if r.module_cache else ''}: {r.runs[-1]}",
                flush=True,
            )
    host_tasks = args.tasks * args.hosts
    base = next(r for r in releases if r.version == lock and not r.module_cache)
    out = {
        "when": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "tasks": args.tasks,
        "hosts": args.hosts,
        "repeats": args.repeats,
        "locked": lock,
        "releases": [
            {
                **asdict(r),
                "wall_s": r.median("wall_s"),
                "cpu_s": r.median("cpu_s"),
                "ms_per_host_task_wall": round(1000 * r.median("wall_s") / host_tasks, 1),
                "ms_per_host_task_cpu": round(1000 * r.median("cpu_s") / host_tasks, 1),
                "wall_vs_locked": round(r.median("wall_s") / base.median("wall_s"), 3),
                "cpu_vs_locked": round(r.median("cpu_s") / base.median("cpu_s"), 3),
            }
            for r in releases
        ],
    }
    for r in out["releases"]:
        r.pop("playbook")
        r.pop("interpreter")
    args.results_dir.mkdir(parents=True, exist_ok=True)
    dest = args.results_dir / f"ansible-core-{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}.json"
    dest.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out["releases"], indent=2))
    print(f"written: {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
