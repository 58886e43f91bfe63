"""`lcm-runner spec validate|docs`: the CLI side of the spec (register with add_parser)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from . import docs
from .errors import SpecInvalid
from .loader import load_cluster, load_inventory_groups


def _validate(args: argparse.Namespace) -> int:
    from . import validate

    if (args.inventory is None) == (args.inventory_opt is None):
        print("lcm-runner spec validate: give the inventory once: INVENTORY or -i INVENTORY", file=sys.stderr)
        return 2
    args.inventory = args.inventory or args.inventory_opt
    try:
        cluster = load_cluster(args.inventory)
    except SpecInvalid as exc:
        print(exc, file=sys.stderr)
        return 2
    try:
        groups = None if args.no_inventory else load_inventory_groups(args.inventory)
    except RuntimeError as exc:  # ansible-inventory missing or failing: one line, no traceback
        print(f"lcm-runner spec validate: {exc}", file=sys.stderr)
        return 2
    lock = None
    lock_file = _lock_file(args)
    if lock_file is not None:
        try:
            lock = (yaml.safe_load(lock_file.read_text()) or {}).get("lcm_lock")
        except (OSError, yaml.YAMLError) as exc:
            print(f"lcm-runner spec validate: {lock_file}: {exc}", file=sys.stderr)
            return 2
        if lock is None:
            print(f"lcm-runner spec validate: {lock_file}: no lcm_lock mapping", file=sys.stderr)
            return 2
    errors = validate(cluster, groups, lock=lock)
    for e in errors:
        print(f"ERROR {e}", file=sys.stderr)
    if errors:
        print(f"{len(errors)} error(s) in {args.inventory}", file=sys.stderr)
        return 2
    checked = f" with the lock {lock_file}" if lock_file else " (no lock checked)"
    print(f"{args.inventory}: cluster spec {cluster['name']!r} valid{checked}")
    return 0


def _lock_file(args: argparse.Namespace) -> Path | None:
    """--lock, else the inventory's group_vars/all/lock.yml (the roles' lcm_lock), else none."""
    if args.lock:
        return Path(args.lock)
    inv = Path(args.inventory)
    found = inv / "group_vars" / "all" / "lock.yml"
    return found if inv.is_dir() and found.is_file() else None


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser("spec", help="validate the cluster spec or regenerate docs/spec.md")
    sub = p.add_subparsers(dest="spec_cmd", required=True)
    v = sub.add_parser("validate", help="validate inventories/<name> (spec + host groups)")
    v.add_argument("inventory", nargs="?", help="inventory directory (or a cluster.yml with --no-inventory)")
    v.add_argument("-i", "--inventory", dest="inventory_opt", metavar="INVENTORY", help="same as INVENTORY")
    v.add_argument("--no-inventory", action="store_true", help="check the spec file only")
    v.add_argument(
        "--lock",
        metavar="FILE",
        help="the lock to check the spec against (default: <inventory>/group_vars/all/lock.yml when present)",
    )
    v.set_defaults(func=_validate)
    d = sub.add_parser("docs", help="write docs/spec.md from the schema")
    d.add_argument("--out", default="docs/spec.md")
    d.add_argument("--check", action="store_true")
    d.set_defaults(func=lambda a: docs.main(["--out", a.out] + (["--check"] if a.check else [])))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="lcm-runner")
    add_parser(ap.add_subparsers(dest="cmd", required=True))
    args = ap.parse_args(argv)
    rc: int = args.func(args)
    return rc


if __name__ == "__main__":
    sys.exit(main())
