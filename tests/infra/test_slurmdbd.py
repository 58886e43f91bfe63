"""Slurm accounting on a converged cluster (roles/slurmdbd; cluster.slurm.accounting).

MariaDB and slurmdbd active on the accounting host, the database password file root 0600 and slurmdbd.conf
slurm 0600, the password in neither slurm.conf nor any file others can read, MariaDB listening on localhost
only, the cluster registered and the spec's accounts and users present, slurm.conf pointing at slurmdbd on
every node, and a finished job in sacct as COMPLETED with exit 0:0. Skips itself where the spec turns
accounting off.

Run: pytest tests/infra/test_slurmdbd.py --hosts=ansible://all --ansible-inventory=inventories/<name>
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from conftest import cluster_spec, host_groups

PASSWORD_FILE = "/etc/slurm/lcm-slurmdbd-db.password"
DBD_CONF = "/etc/slurm/slurmdbd.conf"


def _accounting(host: Any) -> dict[str, Any]:
    spec = cluster_spec(host)
    acct = spec["slurm"]["accounting"]
    if not (spec["layers"]["slurm"] and acct["enabled"]):
        pytest.skip("the spec turns Slurm accounting off (cluster.slurm.accounting.enabled)")
    return acct


def _db_host(host: Any) -> dict[str, Any]:
    acct = _accounting(host)
    if acct["host_group"] not in host_groups(host):
        pytest.skip(f"{host.backend.get_hostname()} is not the accounting host ({acct['host_group']})")
    return acct


def test_mariadb_and_slurmdbd_run_on_the_accounting_host(host: Any) -> None:
    _db_host(host)
    for unit in ("mariadb", "slurmdbd"):
        assert host.service(unit).is_running, unit
        assert host.service(unit).is_enabled, unit


def test_mariadb_listens_on_localhost_only(host: Any) -> None:
    _db_host(host)
    listening = [line.split()[3] for line in host.check_output("ss -Hltn").splitlines()]
    mysql = [a for a in listening if a.rsplit(":", 1)[-1] == "3306"]
    assert mysql == ["127.0.0.1:3306"], mysql


def test_password_files_are_private(host: Any) -> None:
    _db_host(host)
    pw = host.file(PASSWORD_FILE)
    assert pw.is_file and pw.user == "root" and pw.group == "root" and pw.mode == 0o600, (
        pw.user,
        oct(pw.mode),
    )
    conf = host.file(DBD_CONF)
    assert conf.is_file and conf.user == "slurm" and conf.mode == 0o600, (conf.user, oct(conf.mode))
    assert len(host.check_output(f"cat {PASSWORD_FILE}").strip()) >= 16


def test_password_is_in_no_file_others_can_read(host: Any) -> None:
    """Not in slurm.conf (world-readable on every node) nor in any other file under /etc/slurm, the
    logs, the generation store or MariaDB's configuration: only in the two 0600 files."""
    _db_host(host)
    hits = host.run(
        f"grep -rlF -f {PASSWORD_FILE} /etc/slurm /var/log/slurm /var/lib/lcm /etc/mysql 2>/dev/null"
    ).stdout.split()
    assert sorted(hits) == sorted([PASSWORD_FILE, DBD_CONF]), hits
    assert "StoragePass" not in host.file("/etc/slurm/slurm.conf").content_string


def test_database_user_is_granted_the_accounting_database_only(host: Any) -> None:
    _db_host(host)
    grants = host.check_output("mariadb -N -e \"SHOW GRANTS FOR 'slurm'@'localhost'\"").splitlines()
    privileged = [g for g in grants if not g.startswith("GRANT USAGE ON *.*")]
    assert privileged == ["GRANT ALL PRIVILEGES ON `slurm_acct_db`.* TO `slurm`@`localhost`"], privileged


def test_slurm_conf_points_at_slurmdbd(host: Any) -> None:
    acct = _accounting(host)
    conf = host.file("/etc/slurm/slurm.conf").content_string.splitlines()
    assert "AccountingStorageType=accounting_storage/slurmdbd" in conf
    assert f"AccountingStoragePort={acct['port']}" in conf
    assert "JobAcctGatherType=jobacct_gather/linux" in conf
    assert f"ClusterName={cluster_spec(host)['name']}" in conf


@pytest.mark.groups("controller")
def test_cluster_accounts_and_users_registered(host: Any) -> None:
    acct = _accounting(host)
    name = cluster_spec(host)["name"]
    assert name in host.check_output("sacctmgr -n -P list cluster format=Cluster").split()
    assocs = host.check_output(
        f"sacctmgr -n -P list association cluster={name} format=Account,User,ParentName"
    ).splitlines()
    rows = {tuple(line.split("|")) for line in assocs}
    for account in acct["accounts"]:
        assert (account["name"], "", account.get("parent") or "root") in rows, (account, rows)
        for user in account.get("users", []):
            assert (account["name"], user, "") in rows, (account["name"], user, rows)


@pytest.mark.groups("controller")
def test_scontrol_reports_slurmdbd_accounting(host: Any) -> None:
    _accounting(host)
    config = host.check_output("scontrol show config")
    assert "AccountingStorageType   = accounting_storage/slurmdbd" in config


@pytest.mark.groups("controller")
def test_finished_job_is_in_sacct_completed(host: Any) -> None:
    _accounting(host)
    job = host.check_output("sbatch --parsable --nodes=1 --time=1 --output=/dev/null --wrap true").strip()
    assert job.isdigit(), job
    deadline = time.monotonic() + 120
    rows: list[str] = []
    while time.monotonic() < deadline:
        out = host.run(f"sacct -j {job} -X -P -n -o JobID,State,ExitCode")
        rows = out.stdout.split()
        if rows and rows[0].split("|")[1] not in ("PENDING", "RUNNING", "COMPLETING"):
            break
        time.sleep(2)
    assert rows == [f"{job}|COMPLETED|0:0"], rows
