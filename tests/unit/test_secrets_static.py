"""Secrets, statically: every task that touches a secret hides it (no_log) and writes it 0400/0600 with an
owner; the repository tracks no key material.

The checks read the task files as YAML (roles/*/tasks, roles/*/handlers and the playbooks' plays) and
decide from names: a *secret variable* is one named like a password, secret, token or private key, or the
munge key (`munge_key`, `_munge_key`; not `_munge_key_path`, `munge_key_serial`); a *secret path* is a
munge key, a `*.key` / `*.pem` file, an SSH private key or a `*_key_path` variable. Each checker is also
run on in-memory examples that break its rule, so the suite cannot pass because it found nothing.
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]

SECRET_VAR = re.compile(r"password|passwd|passphrase|secret|token|private_?key|privkey|(^|_)munge_key$", re.I)
SECRET_PATH = re.compile(
    r"munge\.key\b|\.key$|\.pem$|_key_path\b|(^|/)id_(rsa|dsa|ecdsa|ed25519)$|(^|/)ssh_host_\w+_key$"
)
READ_MODULES = {"slurp", "fetch", "command", "shell", "raw", "script", "expect"}
WRITE_MODULES = {"copy", "template", "file", "lineinfile", "blockinfile", "ini_file"}
SAFE_MODES = {"0400", "0600", "400", "600", "0o400", "0o600", "u=r", "u=rw", "u=r,go=", "u=rw,go="}
SAFE_MODES |= {"u=r,g=,o=", "u=rw,g=,o="}
TASK_KEYWORDS = {
    "name", "action", "local_action", "args", "async", "become", "become_exe", "become_flags",
    "become_method", "become_user", "changed_when", "check_mode", "collections", "connection", "debugger",
    "delay", "delegate_facts", "delegate_to", "diff", "environment", "failed_when", "ignore_errors",
    "ignore_unreachable", "listen", "loop", "loop_control", "module_defaults", "no_log", "notify", "poll",
    "port", "register", "remote_user", "retries", "run_once", "tags", "throttle", "timeout", "until",
    "vars", "when", "block", "rescue", "always", "any_errors_fatal",
}  # fmt: skip
_JINJA = re.compile(r"{{(.*?)}}|{%(.*?)%}", re.S)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# a quoted literal of prose (a space, a bracket...) names no variable; `['_munge_key']` still does
_LITERAL = re.compile(r"'(?=[^']*[^\w'])[^']*'|\"(?=[^\"]*[^\w\"])[^\"]*\"")


# ----------------------------------------------------------------------------- the task checker


def _strings(obj: Any) -> Iterator[str]:
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _strings(k)
            yield from _strings(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _strings(v)


def jinja_names(obj: Any) -> set[str]:
    """Identifiers used inside {{ }} / {% %} anywhere in obj."""
    names: set[str] = set()
    for s in _strings(obj):
        for m in _JINJA.finditer(s):
            expr = _LITERAL.sub("''", m.group(1) or m.group(2) or "")
            names.update(_NAME.findall(expr))
    return names


def secret_vars(obj: Any) -> list[str]:
    """Names like a secret, except those that say they hold where secrets live (`*_path`, `*_paths`)."""
    return sorted(n for n in jinja_names(obj) if SECRET_VAR.search(n) and not n.endswith(("_path", "_paths")))


def _expand_items(obj: Any, loop: Any) -> list[str]:
    """obj's strings, and each with `{{ item }}` replaced by every literal item of a list loop."""
    out = list(_strings(obj))
    if isinstance(loop, list):
        items = [i for i in loop if isinstance(i, str)]
        out += [s.replace(m, i) for s in out for m in ("{{ item }}", "{{item}}") if m in s for i in items]
    return out


def secret_paths(obj: Any, loop: Any = None) -> list[str]:
    return sorted({s for s in _expand_items(obj, loop) if SECRET_PATH.search(s.strip())})


def module_of(task: dict[str, Any]) -> tuple[str, Any]:
    """(short module name, its arguments with `args:` merged) of a task; ("", {}) for a block."""
    for key, value in task.items():
        if key in TASK_KEYWORDS or key.startswith("with_"):
            continue
        args = value
        if isinstance(task.get("args"), dict):
            args = {**(value if isinstance(value, dict) else {"_raw_params": value}), **task["args"]}
        return key.rsplit(".", 1)[-1], args
    return "", {}


def iter_tasks(tasks: Any, no_log: bool = False) -> Iterator[tuple[dict[str, Any], bool]]:
    """(task, effective no_log) of every task of a task list, through block/rescue/always."""
    for task in tasks or []:
        if not isinstance(task, dict):
            continue
        own = task["no_log"] is True if "no_log" in task else no_log  # a task's own no_log wins
        if any(k in task for k in ("block", "rescue", "always")):
            for k in ("block", "rescue", "always"):
                yield from iter_tasks(task.get(k), own)
        else:
            yield task, own


def _mode_ok(mode: Any) -> bool:
    if isinstance(mode, int) and not isinstance(mode, bool):
        return mode in (0o400, 0o600)
    return isinstance(mode, str) and mode.strip() in SAFE_MODES


def task_problems(task: dict[str, Any], no_log: bool) -> tuple[bool, list[str]]:
    """(does the task handle a secret, what it does wrong)."""
    module, args = module_of(task)
    problems: list[str] = []
    loop = task.get("loop", task.get("with_items"))
    used = secret_vars([args, task.get("vars")])
    reg = task.get("register")
    read = secret_paths(args, loop) if module in READ_MODULES else []
    handles = bool(used or read or (isinstance(reg, str) and SECRET_VAR.search(reg)))
    if used and not no_log:
        problems.append(f"uses secret variable(s) {', '.join(used)} without no_log: true")
    if isinstance(reg, str) and SECRET_VAR.search(reg) and not no_log:
        problems.append(f"registers secret {reg} without no_log: true")
    if read and not no_log:
        problems.append(f"{module} touches secret file(s) {', '.join(read)} without no_log: true")
    if module in WRITE_MODULES and isinstance(args, dict):
        content = {k: args.get(k) for k in ("content", "src", "line", "block", "value")}
        if module == "template":
            content["vars"] = task.get("vars")  # a template's variables are its content
        target = {k: args.get(k) for k in ("dest", "path")}
        writes_secret = bool(secret_vars(content) or secret_paths(target, loop))
        state = args.get("state", "file")
        if writes_secret and state not in ("absent", "directory", "link", "touch"):
            handles = True
            if not _mode_ok(args.get("mode")):
                problems.append(f"writes a secret with mode {args.get('mode')!r} (expected 0400 or 0600)")
            if not args.get("owner"):
                problems.append("writes a secret without an owner")
    return handles, problems


def check_tasks(tasks: Any, where: str) -> tuple[int, list[str]]:
    """(number of secret-handling tasks, violations as '<where>: <task name>: <why>')."""
    handling, out = 0, []
    for task, no_log in iter_tasks(tasks):
        handles, problems = task_problems(task, no_log)
        handling += handles
        out += [f"{where}: {task.get('name', '<unnamed>')}: {p}" for p in problems]
    return handling, out


def task_files() -> list[Path]:
    files = sorted(ROOT.glob("roles/*/tasks/**/*.yml")) + sorted(ROOT.glob("roles/*/handlers/*.yml"))
    return [f for f in files if f.is_file()]


def play_task_lists(path: Path) -> Iterator[Any]:
    for play in yaml.safe_load(path.read_text(encoding="utf-8")) or []:
        if isinstance(play, dict):
            for key in ("pre_tasks", "tasks", "post_tasks", "handlers"):
                yield play.get(key)


# ----------------------------------------------------------------------------- the repository scan


class _AnyTagLoader(yaml.SafeLoader):
    """SafeLoader that keeps Ansible's tagged values (!vault, !unsafe) as Tagged instead of failing."""


class Tagged(str):
    tag = ""


def _tagged(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Tagged:
    value = loader.construct_scalar(node) if isinstance(node, yaml.ScalarNode) else ""
    t = Tagged(value)
    t.tag = "!" + suffix
    return t


_AnyTagLoader.add_multi_constructor("!", _tagged)


def entropy(s: str) -> float:
    """Shannon entropy in bits per character."""
    counts = Counter(s)
    return -sum(c / len(s) * math.log2(c / len(s)) for c in counts.values()) if s else 0.0


_B64 = re.compile(r"[A-Za-z0-9+/_-]{16,}={0,2}")
_LONG_B64 = re.compile(r"[A-Za-z0-9+/]{512,}={0,2}")


def looks_like_key_material(value: str) -> bool:
    """A literal that reads as a generated secret: a base64/hex-like token with high entropy."""
    v = value.strip()
    return bool(_B64.fullmatch(v)) and entropy(v) >= 3.5


def yaml_secret_problems(doc: Any, where: str) -> list[str]:
    """Literal secrets in a YAML document: high-entropy values of secret-named keys, long base64 blobs."""
    out: list[str] = []

    def walk(obj: Any, path: str) -> None:
        if isinstance(obj, dict):
            for k, v in obj.items():
                p = f"{path}.{k}" if path else str(k)
                literal = isinstance(v, str) and not isinstance(v, Tagged) and "{{" not in v
                if literal and SECRET_VAR.search(str(k)) and looks_like_key_material(v):
                    out.append(f"{where}: {p}: a literal secret (use a vaulted or generated value)")
                walk(v, p)
        elif isinstance(obj, list):
            for i, v in enumerate(obj):
                walk(v, f"{path}[{i}]")
        elif isinstance(obj, str) and not isinstance(obj, Tagged) and _LONG_B64.search(obj.replace("\n", "")):
            out.append(f"{where}: {path}: a long base64 blob (key material?)")

    walk(doc, "")
    return out


def tracked_files() -> list[str]:
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run([git, "-C", str(ROOT), "ls-files", "-z"], check=True, capture_output=True)
    return [f for f in out.stdout.decode().split("\0") if f]


KEY_FILE = re.compile(r"(^|/)(munge\.key|[^/]*\.key|[^/]*\.pem|id_(rsa|dsa|ecdsa|ed25519)|ssh_host_\w+_key)$")
PEM_PRIVATE = re.compile(rb"-----BEGIN [A-Z ]*PRIVATE KEY-----")


# ----------------------------------------------------------------------------- the repository's tasks


def test_real_tasks_hide_and_protect_secrets() -> None:
    problems: list[str] = []
    handling = 0
    for f in task_files():
        n, p = check_tasks(yaml.safe_load(f.read_text(encoding="utf-8")), str(f.relative_to(ROOT)))
        handling, problems = handling + n, problems + p
    for f in sorted([*ROOT.glob("playbooks/*.yml"), ROOT / "site.yml"]):
        for tasks in play_task_lists(f):
            n, p = check_tasks(tasks, str(f.relative_to(ROOT)))
            handling, problems = handling + n, problems + p
    assert problems == []
    # Not vacuous: the munge key's generation, read-back, install and the lab's SSH keys were recognised.
    assert handling >= 5, handling


def test_munge_key_tasks_are_recognised_as_secret() -> None:
    """The checker sees the real munge role's key tasks as secret-handling (else it checks nothing)."""
    tasks = yaml.safe_load((ROOT / "roles/munge/tasks/configure.yml").read_text(encoding="utf-8"))
    by_name = {t["name"]: t for t, _ in iter_tasks(tasks)}
    for name in (
        "Generate a new key on the origin (first run or rotation)",
        "Read the cluster key from the origin",
        "Install the cluster key (0400, owned by munge)",
    ):
        handles, problems = task_problems(by_name[name], no_log=True)
        assert handles and problems == [], (name, problems)
        # The same task without no_log is a violation.
        stripped = {k: v for k, v in by_name[name].items() if k != "no_log"}
        assert task_problems(stripped, no_log=False)[1], name
    handles, _ = task_problems(by_name["Record the installed key serial"], no_log=False)
    assert not handles, "the key serial is not a secret"


# ----------------------------------------------------------------------------- the checker on examples

BAD_TASKS = [
    (
        "copy-key-no-nolog-bad-mode",
        {
            "name": "install key",
            "ansible.builtin.copy": {
                "content": "{{ munge_key }}",
                "dest": "/etc/munge/munge.key",
                "mode": "0644",
            },
        },
        ["secret variable(s) munge_key without no_log", "mode '0644'", "without an owner"],
    ),
    (
        "debug-password",
        {"name": "show", "ansible.builtin.debug": {"msg": "pw is {{ db_password }}"}},
        ["db_password without no_log"],
    ),
    (
        "slurp-key",
        {"name": "read", "ansible.builtin.slurp": {"src": "/etc/munge/munge.key"}, "register": "_k"},
        ["slurp touches secret file(s) /etc/munge/munge.key"],
    ),
    (
        "register-secret",
        {"name": "read", "ansible.builtin.command": "cat /x", "register": "_munge_key"},
        ["registers secret _munge_key"],
    ),
    (
        "template-secret-mode-jinja",
        {
            "name": "cfg",
            "ansible.builtin.template": {"src": "db.j2", "dest": "/etc/db.conf", "mode": "{{ m }}"},
            "vars": {"pw": "{{ vault_db_secret }}"},
            "no_log": True,
        },
        ["mode '{{ m }}'"],
    ),
    (
        "file-private-key-world-readable",
        {
            "name": "perm",
            "file": {"path": "/root/.ssh/{{ item }}", "mode": "0644", "owner": "root"},
            "loop": ["id_ed25519", "known_hosts"],
        },
        ["mode '0644'"],
    ),
    (
        "shell-with-token-args",
        {"name": "login", "shell": "curl -H {{ api_token }} x", "args": {"executable": "/bin/bash"}},
        ["api_token without no_log"],
    ),
    (
        "nolog-false-in-nolog-block",
        {
            "name": "b",
            "block": [{"name": "x", "debug": {"var": "{{ a_secret }}"}, "no_log": False}],
            "no_log": True,
        },
        ["a_secret without no_log"],
    ),
]


@pytest.mark.parametrize(("task", "expected"), [c[1:] for c in BAD_TASKS], ids=[c[0] for c in BAD_TASKS])
def test_checker_catches_violations(task: dict[str, Any], expected: list[str]) -> None:
    n, problems = check_tasks([task], "mem.yml")
    assert n >= 1
    for text in expected:
        assert any(text in p for p in problems), problems


GOOD_TASKS = [
    {
        "name": "Install the cluster key",
        "ansible.builtin.copy": {
            "content": "{{ _munge_key.content | b64decode }}",
            "dest": "{{ _munge_key_path }}",
            "owner": "munge",
            "mode": "0400",
        },
        "no_log": True,
    },
    {"name": "in a block", "block": [{"name": "x", "debug": {"msg": "{{ db_password }}"}}], "no_log": True},
    {"name": "paths are not secrets", "ansible.builtin.stat": {"path": "{{ _munge_key_path }}"}},
    {
        "name": "public key",
        "ansible.builtin.slurp": {"src": "/x/ssh_host_ed25519_key.pub"},
        "register": "_pub",
    },
    {"name": "hash keys", "ansible.builtin.set_fact": {"_lcm_runner_key": "{{ x | hash('sha256') }}"}},
    {
        "name": "octal int mode",
        "copy": {"content": "{{ s_secret }}", "dest": "/d", "mode": 0o600, "owner": "r"},
        "no_log": True,
    },
]


@pytest.mark.parametrize("task", GOOD_TASKS, ids=[t["name"] for t in GOOD_TASKS])
def test_checker_accepts_compliant_tasks(task: dict[str, Any]) -> None:
    assert check_tasks([task], "mem.yml")[1] == []


# ----------------------------------------------------------------------------- the repository's content


def test_no_key_files_tracked() -> None:
    files = tracked_files()
    assert len(files) > 50, "git ls-files saw too little"
    assert [f for f in files if KEY_FILE.search(f)] == []


def test_no_key_material_in_tracked_files() -> None:
    """No PEM private key anywhere; no binary 1024-byte file (a raw munge key) among the tracked files."""
    found: list[str] = []
    for f in tracked_files():
        path = ROOT / f
        if not path.is_file():
            continue  # deleted in the working tree, or a submodule
        data = path.read_bytes()
        if PEM_PRIVATE.search(data):
            found.append(f"{f}: a PEM private key")
        if len(data) == 1024 and (b"\0" in data or not _is_utf8(data)):
            found.append(f"{f}: a binary 1024-byte file (a munge key?)")
    assert found == []


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def test_no_literal_secrets_in_tracked_yaml() -> None:
    files = [
        f
        for f in tracked_files()
        if f.endswith((".yml", ".yaml"))
        and (f.startswith(("roles/", "inventories/")) or "group_vars/" in f or "host_vars/" in f)
    ]
    assert files, "no YAML found under roles/ or inventories/"
    problems: list[str] = []
    for f in files:
        path = ROOT / f
        if not path.is_file():
            continue
        for doc in yaml.load_all(path.read_text(encoding="utf-8"), Loader=_AnyTagLoader):
            problems += yaml_secret_problems(doc, f)
    assert problems == []


def test_yaml_scan_catches_literal_secrets() -> None:
    text = """
db_password: "c2VjcmV0c2VjcmV0LXZhbHVlLTEyMzQ1Njc4OTA"
vault_ok_password: !vault |
  $ANSIBLE_VAULT;1.1;AES256
  3934653263336261
templated_secret: "{{ lookup('env', 'X') }}"
munge_key_bytes: 1024
admin_password: changeme
nested: {blob: "%s"}
""" % ("QUJD" * 342)
    (doc,) = yaml.load_all(text, Loader=_AnyTagLoader)
    problems = yaml_secret_problems(doc, "mem.yml")
    assert any("db_password: a literal secret" in p for p in problems), problems
    assert any("nested.blob: a long base64 blob" in p for p in problems), problems
    assert not any(k in p for p in problems for k in ("vault_ok", "templated", "munge_key_bytes")), problems
    assert len(problems) == 2, problems  # a low-entropy placeholder (changeme) is not key material
