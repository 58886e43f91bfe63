"""Base layer (roles/common) on every cluster node."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import ansible
from conftest import cluster_spec, in_container, lcm_fact, lock_for, role_var

SYSCTL_FILE = "/etc/sysctl.d/90-lcm.conf"
LIMITS_FILE = "/etc/security/limits.d/90-lcm.conf"
SYSTEMD_LIMITS_FILE = "/etc/systemd/system.conf.d/90-lcm-limits.conf"


def test_base_packages_pinned_and_held(host: Any) -> None:
    for name in role_var(host, "common", "common_packages"):
        out = host.check_output("dpkg-query -W -f='${Version}|${Status}' %s", name)
        version, status = out.split("|")
        pinned = lock_for(host)["packages"][name]
        assert version == pinned, f"{name} {version} installed, lock pins {pinned}"
        assert status == "hold ok installed", f"{name} not held: {status}"


def test_node_runs_the_specs_release(host: Any) -> None:
    """cluster.os.release on every node (roles/common's preflight refuses a node that runs another)."""
    assert host.system_info.distribution == "debian"
    assert host.system_info.codename == cluster_spec(host)["os"]["release"]


def test_node_fact_matches_the_node(host: Any) -> None:
    fact = lcm_fact(host)
    assert fact["schema"] == 1
    assert fact["cpus"] == int(host.check_output("getconf _NPROCESSORS_ONLN"))
    meminfo = host.file("/proc/meminfo").content_string
    mem_kb = int(re.search(r"^MemTotal:\s+(\d+) kB", meminfo, re.M).group(1))
    assert fact["memory_mb"] == mem_kb // 1024
    numa = host.run("ls -d /sys/devices/system/node/node[0-9]*").stdout.split()
    assert fact["numa_nodes"] == len(numa)
    ib_dir = host.file("/sys/class/infiniband")
    ib = sorted(ib_dir.listdir()) if ib_dir.exists else []
    assert fact["infiniband"] == {"devices": ib, "count": len(ib)}
    gpus = sorted(host.run("ls /dev/ | grep -E '^nvidia[0-9]+$' | sed 's|^|/dev/|'").stdout.split())
    assert fact["gpus"]["devices"] == gpus
    assert fact["iommu"]["mode"] in {"passthrough", "translated", "off", "default"}
    cmdline = host.file("/proc/cmdline").content_string
    if "iommu=pt" in cmdline.split():
        assert fact["iommu"]["mode"] == "passthrough"
    assert fact["container"] == in_container(host)


def test_chrony_configured_and_enabled(host: Any) -> None:
    conf = host.file("/etc/chrony/chrony.conf")
    assert conf.exists and conf.mode == 0o644
    lines = conf.content_string.splitlines()
    for pool in role_var(host, "common", "common_chrony_pools"):
        assert f"pool {pool}" in lines
    for server in role_var(host, "common", "common_chrony_servers"):
        assert f"server {server}" in lines
    service = host.service("chrony")
    assert service.is_enabled
    if lcm_fact(host)["can_set_time"]:
        assert service.is_running
        assert host.run("chronyc -n tracking").rc == 0
    else:
        # No CAP_SYS_TIME (a container): systemd skips the unit by its condition instead of failing it.
        state = host.check_output("systemctl show chrony -p ActiveState -p ConditionResult")
        assert "ActiveState=failed" not in state


def test_sysctl_applied_where_writable(host: Any) -> None:
    wanted: dict[str, Any] = role_var(host, "common", "common_sysctl")
    persisted = host.file(SYSCTL_FILE)
    persisted_text = persisted.content_string if persisted.exists else ""
    paths = {key: "/proc/sys/" + key.replace(".", "/") for key in wanted}
    probe = host.check_output(
        'for p in %s; do if [ -w $p ]; then echo "$p $(cat $p)"; fi; done', " ".join(paths.values())
    )
    current = {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in probe.splitlines() if line}
    applied = 0
    for key, value in wanted.items():
        if paths[key] not in current:
            assert f"{key} =" not in persisted_text and f"{key}=" not in persisted_text, (
                f"{key} persisted although this node cannot write it"
            )
            continue
        applied += 1
        assert current[paths[key]].split() == str(value).split(), f"{key} not applied"
        assert re.search(rf"^{re.escape(key)}\s*=\s*{re.escape(str(value))}$", persisted_text, re.M)
    if not in_container(host):
        assert applied == len(wanted), "a full node must be able to apply every sysctl"


def test_memlock_limits(host: Any) -> None:
    if not role_var(host, "common", "common_memlock_unlimited"):
        return
    if lcm_fact(host)["can_raise_rlimits"]:
        limits = host.file(LIMITS_FILE)
        assert limits.exists and limits.mode == 0o644
        assert re.search(r"^\*\s+hard\s+memlock\s+unlimited$", limits.content_string, re.M)
        assert "DefaultLimitMEMLOCK=infinity" in host.file(SYSTEMD_LIMITS_FILE).content_string
        assert host.check_output("systemctl show -p DefaultLimitMEMLOCK") == "DefaultLimitMEMLOCK=infinity"
    else:
        # Writing them would break PAM logins (setrlimit EPERM): the role must leave them out.
        assert not host.file(LIMITS_FILE).exists
        assert not host.file(SYSTEMD_LIMITS_FILE).exists


def test_managed_files_recorded(host: Any) -> None:
    record = host.file("/var/lib/lcm/managed.d/common.json")
    assert record.exists and record.mode == 0o644
    assert host.file("/var/lib/lcm/managed.d").mode == 0o755
    data = json.loads(record.content_string)
    assert data["role"] == "common"
    assert data["packages"] == role_var(host, "common", "common_packages")
    assert "/etc/chrony/chrony.conf" in data["files"]
    assert "/etc/ansible/facts.d/lcm.fact" in data["files"]
    for path in data["files"]:
        assert path.startswith("/") and host.file(path).exists, f"{path} recorded but missing"


def test_module_cache_serves_the_converges_modules(host: Any) -> None:
    """roles/common's bytecode cache (common_module_cache): the hook is loaded by the node's system Python,
    the cache directory is root's alone, and the converge's own modules filled it: the entry of the
    controller's module_utils/basic.py (every module imports it) sits where the hook's key puts it."""
    version = host.check_output("/usr/bin/python3 -c 'import sys; print(\"%d.%d\" % sys.version_info[:2])'")
    site = f"/usr/local/lib/python{version}/dist-packages"
    hook, pth = host.file(f"{site}/lcm_module_cache.py"), host.file(f"{site}/lcm-module-cache.pth")
    cache = host.file("/var/cache/lcm/module-cache")
    if not role_var(host, "common", "common_module_cache"):
        assert not hook.exists and not pth.exists and not cache.exists
        return
    assert hook.exists and hook.user == "root" and hook.mode == 0o644
    assert pth.content_string == "import lcm_module_cache\n"
    assert cache.is_directory and cache.user == "root" and cache.group == "root" and cache.mode == 0o700
    hooks = host.check_output("/usr/bin/python3 -c 'import sys; print(sys.path_hooks[0].__module__)'")
    assert hooks == "lcm_module_cache"
    magic = bytes.fromhex(
        host.check_output("/usr/bin/python3 -c 'import importlib.util as u; print(u.MAGIC_NUMBER.hex())'")
    )
    basic = (Path(ansible.__file__).parent / "module_utils" / "basic.py").read_bytes()
    entry = host.file(f"/var/cache/lcm/module-cache/{hashlib.sha256(magic + basic).hexdigest()}")
    assert entry.exists and entry.user == "root" and entry.size > 0, "basic.py never went through the cache"
    assert (
        "/var/cache/lcm/module-cache 0700 root root 30d"
        in host.file("/etc/tmpfiles.d/lcm-module-cache.conf").content_string
    )
