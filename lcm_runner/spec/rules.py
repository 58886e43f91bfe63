"""Cross-field rules of the cluster spec and the inventory checks (the schema's x-rules, in code)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from .errors import SpecError
from .hostlist import EXPECTED as HOSTLIST_EXPECTED
from .hostlist import HostlistError, expand
from .safe import host_problem, path_inside, path_problem, system_path_problem
from .schema import fill_defaults

NODE_GROUPS = ("controller", "compute", "login", "monitoring")
# Pairs of groups no host may be in together.
EXCLUSIVE_GROUPS = (("controller", "compute"), ("login", "compute"))


def _get(spec: Mapping[str, Any], dotted: str) -> Any:
    cur: Any = spec
    for part in dotted.split("."):
        if not isinstance(cur, Mapping) or part not in cur:
            return None
        cur = cur[part]
    return cur


def spec_rules(c: Mapping[str, Any]) -> list[SpecError]:
    """Rules between fields of a spec that already passed the schema (types are right)."""
    c = fill_defaults(c)
    e: list[SpecError] = []
    gpu, fabric, storage, layers = c["gpu"], c["fabric"], c["storage"], c["layers"]

    count = gpu["count_per_node"]
    if gpu["model"] == "none" and count != 0:
        e.append(SpecError("cluster.gpu.count_per_node", count, "0 when cluster.gpu.model is none"))
    if gpu["model"] != "none" and count == 0:
        e.append(SpecError("cluster.gpu.model", gpu["model"], "none when cluster.gpu.count_per_node is 0"))
    if count > 0 and not gpu["gres_type"]:
        e.append(
            SpecError(
                "cluster.gpu.gres_type", gpu["gres_type"], f"a gres type name (Gres=gpu:<type>:{count})"
            )
        )
    if count == 0 and gpu["gres_type"]:
        e.append(
            SpecError("cluster.gpu.gres_type", gpu["gres_type"], '"" when count_per_node is 0 (no gres)')
        )
    if gpu["nvswitch"] and count < 2:
        e.append(SpecError("cluster.gpu.nvswitch", True, f"false with {count} GPU(s) per node (needs >= 2)"))
    if gpu["nvlink"] and count < 2:
        e.append(
            SpecError(
                "cluster.gpu.nvlink",
                True,
                f"false with {count} GPU(s) per node (NVLink connects GPU pairs; needs >= 2)",
            )
        )

    ftype, hcas = fabric["type"], fabric["hcas"]
    if ftype in ("infiniband", "roce") and not hcas:
        e.append(
            SpecError("cluster.fabric.hcas", hcas, f"at least one HCA (e.g. mlx5_0) for fabric type {ftype}")
        )
    if ftype == "ethernet" and hcas:
        e.append(
            SpecError("cluster.fabric.hcas", hcas, "[] for fabric type ethernet (or type infiniband/roce)")
        )
    if ftype == "infiniband" and fabric["rate_gbps"] == 0:
        e.append(SpecError("cluster.fabric.rate_gbps", 0, "the expected IB link rate (100/200/400/800)"))
    gid = fabric["roce_gid_index"]
    if ftype == "roce" and gid is None:
        e.append(
            SpecError(
                "cluster.fabric.roce_gid_index", gid, "an integer GID index (RoCE v2) for fabric type roce"
            )
        )
    if ftype != "roce" and gid is not None:
        e.append(SpecError("cluster.fabric.roce_gid_index", gid, f"null for fabric type {ftype}"))

    e += _storage_paths(storage)
    stype = storage["type"]
    if "nfs" in storage and stype != "nfs":
        e.append(SpecError("cluster.storage.nfs", storage["nfs"], f"absent for storage type {stype}"))
    if storage.get("fstype") and stype != "existing":
        e.append(
            SpecError("cluster.storage.fstype", storage["fstype"], f'"" or absent for storage type {stype}')
        )
    e += _topology(fabric["topology"])

    parts = c["slurm"]["partitions"]
    names = [p["name"] for p in parts]
    for n in sorted({n for n in names if names.count(n) > 1}):
        e.append(SpecError("cluster.slurm.partitions", names, f"unique partition names ({n!r} repeats)"))
    default = [p["name"] for p in parts if p["default"]]
    if len(default) != 1:
        e.append(SpecError("cluster.slurm.partitions[].default", default, "exactly one default partition"))
    e += _node_slots(c["slurm"].get("node_slots", ""))
    e += _accounting(c["slurm"]["accounting"])

    if layers["nvidia"] and count == 0:
        e.append(SpecError("cluster.layers.nvidia", True, "false when cluster.gpu.count_per_node is 0"))
    if layers["rdma"] and ftype == "ethernet":
        e.append(SpecError("cluster.layers.rdma", True, "false for fabric type ethernet"))
    if layers["pyxis"] and not (layers["enroot"] and layers["slurm"]):
        e.append(
            SpecError("cluster.layers.pyxis", True, "false unless layers.enroot and layers.slurm are true")
        )
    e += _monitoring(c["monitoring"])
    return e


def _node_slots(slots: str) -> list[SpecError]:
    """slurm.node_slots is a Slurm hostlist of valid host names (or empty)."""
    if not slots:
        return []
    try:
        names = expand(slots)
    except HostlistError as exc:
        return [SpecError("cluster.slurm.node_slots", slots, f"{HOSTLIST_EXPECTED}; {exc}")]
    bad = [(n, why) for n in names if (why := host_problem(n))]
    if bad:
        return [SpecError("cluster.slurm.node_slots", slots, f"names that are {bad[0][1]} ({bad[0][0]!r})")]
    return []


def _accounting(acct: Mapping[str, Any]) -> list[SpecError]:
    """Account names unique and not root; each parent is root or an account listed before it (which also
    rules out cycles and gives sacctmgr its order: a parent exists before its children)."""
    e: list[SpecError] = []
    seen: list[str] = []
    for i, account in enumerate(acct["accounts"]):
        path = f"cluster.slurm.accounting.accounts[{i}]"
        name, parent = account["name"], account["parent"]
        if name == "root":
            e.append(
                SpecError(f"{path}.name", name, "an account name other than root (Slurm's own top account)")
            )
            continue
        if name in seen:
            e.append(SpecError(f"{path}.name", name, f"a unique account name ({name!r} is listed before)"))
        if parent == name:
            e.append(SpecError(f"{path}.parent", parent, "another account than the account itself (or root)"))
        elif parent != "root" and parent not in seen:
            known = ", ".join(["root", *dict.fromkeys(seen)])
            e.append(
                SpecError(
                    f"{path}.parent", parent, f"root or an account listed before this one (known: {known})"
                )
            )
        seen.append(name)
    return e


def _monitoring(mon: Mapping[str, Any]) -> list[SpecError]:
    """The webhook receiver has a URL; the textfile directory is not a system directory itself."""
    e: list[SpecError] = []
    am = mon["alertmanager"]
    if am["receiver"] == "webhook" and not am["webhook_url"]:
        e.append(
            SpecError(
                "cluster.monitoring.alertmanager.webhook_url", "", "an http(s) URL for receiver webhook"
            )
        )
    if am["receiver"] == "none" and am["webhook_url"]:
        e.append(
            SpecError(
                "cluster.monitoring.alertmanager.webhook_url",
                am["webhook_url"],
                '"" for receiver none (or receiver webhook)',
            )
        )
    path = mon["textfile_dir"]
    if isinstance(path, str) and (why := system_path_problem(path)):
        e.append(SpecError("cluster.monitoring.textfile_dir", path, why))
    return e


def topology_nodes(topology: list[Mapping[str, Any]]) -> list[str]:
    """Every node name the topology's leaf switches list (malformed expressions are skipped)."""
    names: list[str] = []
    for sw in topology:
        with contextlib.suppress(HostlistError):
            names += expand(sw["nodes"]) if sw.get("nodes") else []
    return names


def _topology(topology: list[Mapping[str, Any]]) -> list[SpecError]:
    """Each switch has nodes or switches, written as Slurm hostlists; names unique; children defined."""
    e: list[SpecError] = []
    switches = [sw["switch"] for sw in topology]
    for n in sorted({n for n in switches if switches.count(n) > 1}):
        e.append(
            SpecError("cluster.fabric.topology[].switch", switches, f"unique switch names ({n!r} repeats)")
        )
    for i, sw in enumerate(topology):
        path = f"cluster.fabric.topology[{i}]"
        if not sw.get("nodes") and not sw.get("switches"):
            e.append(SpecError(path, sw, "a switch with nodes or switches"))
        for field in ("nodes", "switches"):
            if not sw.get(field):
                continue
            try:
                names = expand(sw[field])
            except HostlistError as exc:
                e.append(SpecError(f"{path}.{field}", sw[field], f"{HOSTLIST_EXPECTED}; {exc}"))
                continue
            if field == "nodes":
                bad = [(n, why) for n in names if (why := host_problem(n))]
                if bad:
                    e.append(
                        SpecError(f"{path}.nodes", sw["nodes"], f"names that are {bad[0][1]} ({bad[0][0]!r})")
                    )
            else:
                unknown = [n for n in names if n not in switches]
                if unknown:
                    e.append(
                        SpecError(
                            f"{path}.switches",
                            sw["switches"],
                            f"switches defined in cluster.fabric.topology (unknown: {', '.join(unknown)})",
                        )
                    )
    return e


def _storage_paths(storage: Mapping[str, Any]) -> list[SpecError]:
    """checkpoint_dir inside mountpoint, local_scratch outside it, none of them `/` or a system directory.

    Paths are compared only once they are known to be normalised (safe.path_inside refuses `..`, `.` and
    `//`), so "/shared/../etc" can never count as inside /shared.
    """
    e: list[SpecError] = []
    mount, ckpt = storage["mountpoint"], storage["checkpoint_dir"]
    if not path_inside(ckpt, mount):
        why = path_problem(ckpt) or path_problem(mount)
        expected = f"a path inside storage.mountpoint ({mount})" + (f"; {why}" if why else "")
        e.append(SpecError("cluster.storage.checkpoint_dir", ckpt, expected))
    scratch = storage["local_scratch"]
    if isinstance(scratch, str) and mount != "/" and path_inside(scratch, mount):
        e.append(
            SpecError(
                "cluster.storage.local_scratch",
                scratch,
                f"a node-local path, not inside the shared storage.mountpoint ({mount})",
            )
        )
    nfs = storage.get("nfs") or {}
    for field, value in (
        ("mountpoint", mount),
        ("local_scratch", scratch),
        ("nfs.export_path", nfs.get("export_path")),
    ):
        if value == "/":
            e.append(SpecError(f"cluster.storage.{field}", value, "a directory other than / (the root)"))
        elif isinstance(value, str) and (why := system_path_problem(value)):
            e.append(SpecError(f"cluster.storage.{field}", value, why))
    return e


def _host_path(host: str) -> str:
    """inventory.host.<name>; a name with unprintable characters is shown as its repr."""
    return f"inventory.host.{host}" if host.isprintable() else f"inventory.host.{host!r}"


def host_name_rules(groups: Mapping[str, list[str]]) -> list[SpecError]:
    """Every inventory host name is an RFC 1123 host name (it becomes an ssh/scontrol argument)."""
    hosts = sorted({h for members in groups.values() for h in members}, key=str)
    e: list[SpecError] = []
    for host in hosts:
        why = host_problem(host)
        if why:
            e.append(SpecError(_host_path(str(host)), host, why))
    return e


def _accounting_host(
    c: Mapping[str, Any], groups: Mapping[str, list[str]], compute: set[str]
) -> list[SpecError]:
    """With accounting on (and Slurm): its host group exists and holds exactly 1 host, not a compute host."""
    acct = _get(c, "slurm.accounting") or {}
    if not (_get(c, "layers.slurm") and acct.get("enabled", True)):
        return []
    group = acct.get("host_group", "controller")
    path = "cluster.slurm.accounting.host_group"
    if not isinstance(group, str):
        return []
    hosts = list(groups.get(group, []))
    if group not in groups:
        known = ", ".join(sorted(k for k in groups if k not in ("all", "ungrouped")))
        return [SpecError(path, group, f"an inventory group with exactly 1 host (known: {known})")]
    if len(hosts) != 1:
        found = ", ".join(hosts) if hosts else "none"
        return [
            SpecError(path, group, f"a group with exactly 1 host: one slurmdbd (found {len(hosts)}: {found})")
        ]
    if hosts[0] in compute:
        return [
            SpecError(
                path,
                group,
                f"a group whose host is not a compute host ({hosts[0]} is in compute; e.g. controller)",
            )
        ]
    return []


def inventory_rules(c: Mapping[str, Any], groups: Mapping[str, list[str]]) -> list[SpecError]:
    """Checks of the inventory's groups (Ansible's `groups` variable) against the spec."""
    e: list[SpecError] = host_name_rules(groups)
    ctl = list(groups.get("controller", []))
    if len(ctl) != 1:
        e.append(SpecError("inventory.groups.controller", ctl, "exactly 1 host"))
    if not groups.get("compute"):
        e.append(SpecError("inventory.groups.compute", list(groups.get("compute", [])), "at least 1 host"))
    if _get(c, "layers.monitoring") and not groups.get("monitoring"):
        e.append(
            SpecError(
                "inventory.groups.monitoring",
                list(groups.get("monitoring", [])),
                "at least 1 host (layers.monitoring is true)",
            )
        )
    for a, b in EXCLUSIVE_GROUPS:
        both = sorted(set(groups.get(a, [])) & set(groups.get(b, [])))
        for host in both:
            e.append(
                SpecError(_host_path(host), [a, b], f"a host in only one of the exclusive groups {a} / {b}")
            )
    storage = _get(c, "storage") or {}
    if storage.get("type") == "nfs":
        sg = (storage.get("nfs") or {}).get("server_group")
        if not groups.get(sg):
            e.append(
                SpecError("cluster.storage.nfs.server_group", sg, "an inventory group with at least 1 host")
            )
    compute = set(groups.get("compute", []))
    e += _accounting_host(c, groups, compute)
    fabric = _get(c, "fabric") or {}
    if isinstance(fabric.get("topology"), list):
        unknown = [n for n in dict.fromkeys(topology_nodes(fabric["topology"])) if n not in compute]
        if unknown:
            e.append(
                SpecError(
                    "cluster.fabric.topology[].nodes",
                    unknown,
                    "inventory hosts of group compute (the nodes slurm.conf defines; not there: "
                    + ", ".join(unknown[:10])
                    + (", ..." if len(unknown) > 10 else "")
                    + ")",
                )
            )
    for i, part in enumerate(_get(c, "slurm.partitions") or []):
        for g in part.get("groups", []):
            path = f"cluster.slurm.partitions[{i}].groups"
            if g not in groups:
                known = ", ".join(sorted(k for k in groups if k not in ("all", "ungrouped")))
                e.append(SpecError(path, g, f"an inventory group (known: {known})"))
            elif not groups[g]:
                e.append(SpecError(path, g, "a group with at least 1 host"))
            elif not set(groups[g]) <= compute:
                extra = sorted(set(groups[g]) - compute)
                e.append(
                    SpecError(path, g, f"a group of compute hosts only ({', '.join(extra)} not in compute)")
                )
    return e
