"""roles/grafana without Grafana: its templates (rendered by Ansible's own engine), its preflight, secrets and
dashboard-copy task files run for real on localhost with every path in tmp, and its task files read as YAML
(every task that handles the admin password or the secret key has no_log)."""

from __future__ import annotations

import configparser
import grp
import json
import os
import pwd
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from _role_render import render
from _role_run import REPO, lock, run_role, spec
from test_secrets_static import check_tasks, iter_tasks

ROLE = "grafana"
TASKS = REPO / "roles/grafana/tasks"
VAULTED = "Vaulted-Admin-Passw0rd-For-Tests"
MON = {"inventory_hostname": "mon01", "_monitoring_listen_address": "10.20.0.5"}


def _ini(**over: Any) -> configparser.ConfigParser:
    text = render(ROLE, "grafana.ini.j2", {"cluster": spec(), "lcm_lock": lock(), **MON, **over})
    ini = configparser.ConfigParser(interpolation=None)
    ini.read_string(text)
    return ini


# ----------------------------------------------------------------------------- grafana.ini


def test_ini_listens_on_the_cluster_address_and_refuses_anonymous_access() -> None:
    ini = _ini()
    assert ini["server"]["http_addr"] == "10.20.0.5"
    assert ini["server"]["http_port"] == "3000"
    assert ini["auth.anonymous"]["enabled"] == "false"
    assert ini["users"]["allow_sign_up"] == "false"
    assert ini["users"]["allow_org_create"] == "false"
    assert ini["analytics"]["reporting_enabled"] == "false"
    assert ini["analytics"]["check_for_updates"] == "false"
    assert ini["snapshots"]["external_enabled"] == "false"


def test_ini_reads_the_secrets_from_files_and_holds_no_password() -> None:
    ini = _ini(grafana_admin_password=VAULTED, grafana_admin_user="ops")
    assert ini["security"]["admin_user"] == "ops"
    assert ini["security"]["admin_password"] == "$__file{/etc/grafana/lcm-admin-password}"
    assert ini["security"]["secret_key"] == "$__file{/etc/grafana/lcm-secret-key}"
    text = render(
        ROLE,
        "grafana.ini.j2",
        {"cluster": spec(), "lcm_lock": lock(), **MON, "grafana_admin_password": VAULTED},
    )
    assert VAULTED not in text


def test_ini_never_binds_every_address_unless_the_spec_says_so() -> None:
    assert _ini()["server"]["http_addr"] != "0.0.0.0"
    # bind_any_address is decided by roles/_monitoring: the template writes the address it was given.
    assert _ini(_monitoring_listen_address="0.0.0.0")["server"]["http_addr"] == "0.0.0.0"


# ----------------------------------------------------------------------------- provisioning files


def _yaml(template: str, **over: Any) -> dict[str, Any]:
    return yaml.safe_load(render(ROLE, template, {"cluster": spec(), **MON, **over}))


def test_datasource_is_the_monitoring_hosts_prometheus_and_the_default() -> None:
    (ds,) = _yaml("lcm-prometheus.yaml.j2")["datasources"]
    assert ds["url"] == "http://mon01:9090"
    assert (ds["uid"], ds["type"], ds["isDefault"], ds["access"]) == (
        "prometheus",
        "prometheus",
        True,
        "proxy",
    )
    assert ds["jsonData"]["timeInterval"] == "15s", "the scrape interval of the spec"
    (ds,) = _yaml("lcm-prometheus.yaml.j2", grafana_prometheus_url="http://prom.internal:9091")["datasources"]
    assert ds["url"] == "http://prom.internal:9091"


def test_dashboard_provider_reads_the_copied_files_read_only() -> None:
    (provider,) = _yaml("lcm-dashboards.yaml.j2")["providers"]
    assert provider["type"] == "file"
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards/lcm"
    assert provider["allowUiUpdates"] is False and provider["disableDeletion"] is True
    assert provider["folder"] == "LCM"


# ----------------------------------------------------------------------------- secrets in the task files


def _task_files() -> dict[str, list[dict[str, Any]]]:
    return {f.name: yaml.safe_load(f.read_text()) for f in sorted(TASKS.glob("*.yml"))}


SECRET_WORDS = re.compile(
    r"grafana_admin_password\b|_grafana_admin_secret|_grafana_admin_password_path|_grafana_secret_key_path"
)


def _without_messages(task: dict[str, Any]) -> dict[str, Any]:
    """The task less its name and the messages of assert/debug (prose that may name a file, never a value)."""
    out = {k: v for k, v in task.items() if k != "name"}
    for module in ("ansible.builtin.assert", "ansible.builtin.debug"):
        if isinstance(out.get(module), dict):
            out[module] = {
                k: v for k, v in out[module].items() if k not in ("fail_msg", "success_msg", "msg")
            }
    return out


def test_every_task_that_handles_a_secret_has_no_log() -> None:
    handling = []
    for name, tasks in _task_files().items():
        for task, no_log in iter_tasks(tasks):
            touched = SECRET_WORDS.findall(json.dumps(_without_messages(task)))
            if not touched:
                continue
            if task.get("ansible.builtin.include_role", {}).get("tasks_from") == "manifest":
                continue  # names the paths so that the generation record keeps their hashes only
            handling.append(f"{name}: {task['name']}")
            assert no_log, f"{name}: {task['name']} handles {sorted(set(touched))} without no_log: true"
    # generate, write the vaulted one, permissions, weigh, slurp, two API calls
    assert len(handling) >= 7, handling


def test_the_repository_secrets_check_sees_the_role_and_finds_nothing_wrong() -> None:
    for name, tasks in _task_files().items():
        assert check_tasks(tasks, name)[1] == []
    assert check_tasks(_task_files()["secrets.yml"], "secrets.yml")[0] >= 2


def test_secrets_are_recorded_by_hash_only() -> None:
    (record,) = [
        t for t in _task_files()["configure.yml"] if "_generation_manifest_role" in t.get("vars", {})
    ]
    secret_paths = record["vars"]["_generation_manifest_secret_paths"]
    assert secret_paths == ["{{ _grafana_admin_password_path }}", "{{ _grafana_secret_key_path }}"]
    assert "password" not in str(record["vars"]["_generation_manifest_files"])


# ----------------------------------------------------------------------------- the secrets tasks, for real


def _me() -> dict[str, str]:
    user = pwd.getpwuid(os.getuid()).pw_name
    return {"_grafana_user": user, "_grafana_group": grp.getgrgid(os.getgid()).gr_name}


def _secrets(tmp_path: Path, **extra: Any):
    paths = {
        "_grafana_admin_password_path": str(tmp_path / "etc/lcm-admin-password"),
        "_grafana_secret_key_path": str(tmp_path / "etc/lcm-secret-key"),
    }
    (tmp_path / "etc").mkdir(exist_ok=True)
    run = run_role(ROLE, tmp_path, {"cluster": spec(), **paths, **_me(), **extra}, tasks_from="secrets")
    return run, Path(paths["_grafana_admin_password_path"]), Path(paths["_grafana_secret_key_path"])


def test_admin_password_and_key_are_generated_once_strong_and_unprinted(tmp_path: Path) -> None:
    run, password, key = _secrets(tmp_path)
    assert run.rc == 0, run.failed_msgs or run.stderr[-2000:]
    first = password.read_text()
    assert re.fullmatch(r"[A-Za-z0-9]{36,}", first), (
        "about 43 base64 characters of 32 random bytes, symbols dropped"
    )
    assert key.read_text() != first
    for f in (password, key):
        assert f.stat().st_mode & 0o777 == 0o400
    assert first not in run.stdout + run.stderr
    again, _, _ = _secrets(tmp_path)
    assert again.rc == 0 and password.read_text() == first, "generated once: a second run keeps it"
    assert first not in again.stdout + again.stderr


def test_vaulted_password_wins_and_is_never_printed(tmp_path: Path) -> None:
    _secrets(tmp_path)  # a generated one is there already
    run, password, _ = _secrets(tmp_path, grafana_admin_password=VAULTED)
    assert run.rc == 0, run.failed_msgs or run.stderr[-2000:]
    assert password.read_text() == VAULTED
    assert password.stat().st_mode & 0o777 == 0o400
    assert VAULTED not in run.stdout + run.stderr


# ----------------------------------------------------------------------------- the preflight, run for real


def _locked() -> dict[str, Any]:
    lk = lock()
    lk["artifacts"]["grafana"] = {**lk["artifacts"]["grafana"], "sha256": "cd" * 32}
    return lk


def _dashboards(tmp_path: Path, *docs: Any) -> Path:
    d = tmp_path / "dashboards"
    d.mkdir(exist_ok=True)
    for i, doc in enumerate(docs):
        (d / f"d{i}.json").write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return d


def _preflight(tmp_path: Path, cluster: dict | None = None, **extra: Any):
    return run_role(ROLE, tmp_path, {"cluster": cluster or spec(), **extra}, tags="grafana_preflight")


def test_preflight_refuses_when_the_spec_turns_grafana_off(tmp_path: Path) -> None:
    run = _preflight(tmp_path, spec(monitoring={"grafana": {"enabled": False}}), lcm_lock=_locked())
    assert run.rc != 0
    assert "cluster.monitoring.grafana.enabled is false" in " ".join(run.failed_msgs)


def test_preflight_names_the_lock_update_for_an_unlocked_deb(tmp_path: Path) -> None:
    run = _preflight(tmp_path)
    assert run.rc != 0
    (msg,) = run.failed_msgs
    assert "lcm_lock.artifacts.grafana (grafana_11.6.0_amd64.deb) is not locked (sha256 is null)" in msg
    assert "`lcm-runner lock update <dir>`" in msg


def test_preflight_needs_the_debs_dependencies_pinned(tmp_path: Path) -> None:
    lk = _locked()
    del lk["packages"]["musl"]
    run = _preflight(tmp_path, lcm_lock=lk)
    assert run.rc != 0
    assert "lcm_lock.packages has no pinned version for musl" in " ".join(run.failed_msgs)


def test_preflight_passes_on_the_repository_dashboards(tmp_path: Path) -> None:
    files = sorted((REPO / "roles/grafana/files/dashboards").glob("*.json"))
    run = _preflight(tmp_path, lcm_lock=_locked())
    assert run.rc == 0, run.failed_msgs or run.stderr[-2000:]
    got = run.task("Collect the dashboards' uids")["ansible_facts"]["_grafana_dashboard_uids"]
    assert len(got) == len(files)
    assert sorted(got) == sorted(json.loads(f.read_text())["uid"] for f in files)
    listen = run.task("Set the listen address")["ansible_facts"]["_monitoring_listen_address"]
    assert listen == "127.0.0.1", "fabric.socket_ifname lo: its address, never 0.0.0.0 by default"


def test_preflight_with_no_dashboard_says_so(tmp_path: Path) -> None:
    run = _preflight(tmp_path, lcm_lock=_locked(), grafana_dashboards_src=str(_dashboards(tmp_path)))
    assert run.rc == 0, run.failed_msgs
    assert run.task("Collect the dashboards' uids")["ansible_facts"]["_grafana_dashboard_uids"] == []
    assert (
        "has no *.json: Grafana gets its datasource but no dashboard"
        in run.task("Say when there is no")["msg"]
    )


def test_preflight_picks_up_every_json_of_the_directory(tmp_path: Path) -> None:
    src = _dashboards(tmp_path, {"uid": "a", "title": "A"}, {"uid": "b", "title": "B"})
    (src / "notes.txt").write_text("not a dashboard")
    run = _preflight(tmp_path, lcm_lock=_locked(), grafana_dashboards_src=str(src))
    assert run.rc == 0, run.failed_msgs
    files = run.task("List the dashboards to provision")["ansible_facts"]["_grafana_dashboard_files"]
    assert [Path(f).name for f in files] == ["d0.json", "d1.json"]


@pytest.mark.parametrize(
    ("docs", "expect"),
    [
        (({"title": "no uid"},), "d0.json is not a Grafana dashboard: a JSON object with a non-empty uid."),
        (({"uid": "same"}, {"uid": "same"}), "more than one file has the dashboard uid same"),
    ],
)
def test_preflight_refuses_bad_dashboards(tmp_path: Path, docs: tuple, expect: str) -> None:
    run = _preflight(tmp_path, lcm_lock=_locked(), grafana_dashboards_src=str(_dashboards(tmp_path, *docs)))
    assert run.rc != 0
    (failed,) = [r["result"] for r in run.results if r["result"].get("failed")]
    msgs = [failed.get("msg", "")] + [i.get("msg", "") for i in failed.get("results", []) if i.get("failed")]
    assert any(expect in m for m in msgs), msgs


def test_preflight_refuses_a_short_vaulted_password_without_showing_it(tmp_path: Path) -> None:
    run = _preflight(tmp_path, lcm_lock=_locked(), grafana_admin_password="short-pw")
    assert run.rc != 0
    assert "grafana_admin_password is set but shorter than 12 characters" in " ".join(run.failed_msgs)
    assert "short-pw" not in run.stdout + run.stderr


# ----------------------------------------------------------------------------- the dashboard copy, for real


def test_dashboard_copy_adds_new_files_and_removes_vanished_ones(tmp_path: Path) -> None:
    src = _dashboards(tmp_path, {"uid": "a"}, {"uid": "b"})
    dest = tmp_path / "var/dashboards"
    dest.mkdir(parents=True)
    (dest / "old.json").write_text("{}")
    (dest / "README").write_text("left alone")
    extra = {"grafana_dashboards_src": str(src), "_grafana_dashboards_dir": str(dest), **_me()}
    run = run_role(ROLE, tmp_path, {"cluster": spec(), **extra}, tasks_from="dashboards_copy")
    assert run.rc == 0, run.failed_msgs or run.stderr[-2000:]
    assert sorted(p.name for p in dest.iterdir()) == ["README", "d0.json", "d1.json"]
    (src / "d9.json").write_text(json.dumps({"uid": "z"}))
    (src / "d0.json").unlink()
    run = run_role(ROLE, tmp_path, {"cluster": spec(), **extra}, tasks_from="dashboards_copy")
    assert run.rc == 0, run.failed_msgs
    assert sorted(p.name for p in dest.iterdir()) == ["README", "d1.json", "d9.json"]
    assert json.loads((dest / "d9.json").read_text()) == {"uid": "z"}
