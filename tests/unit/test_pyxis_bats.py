"""tests/pyxis/run_bats.py offline: the rewrites of Pyxis' bats tests, the selection table, the TAP parser."""

from __future__ import annotations

import copy
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
IMG = "/shared/pyxis-bats/images/debian12-minbase.sqsh"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("pyxis_run_bats", ROOT / "tests" / "pyxis" / "run_bats.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look the module up while the class is built
    spec.loader.exec_module(mod)
    return mod


rb = _load()


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> object:
    lock = rb.load_lock()
    if not (rb.MIRROR / lock["artifacts"]["pyxis"]["filename"]).is_file():
        pytest.skip(f"no Pyxis tarball in the offline mirror {rb.MIRROR}")
    return rb.prepare(tmp_path_factory.mktemp("pyxis"), IMG)


def _rw(file: str, text: str) -> tuple[str, dict[str, int]]:
    out: tuple[str, dict[str, int]] = rb.rewrite_text(file, text, IMG)
    return out


def test_image_references_become_the_local_image() -> None:
    for before in (
        "run_srun --container-image=ubuntu:18.04 sh -c 'echo $FOO'",
        "run_srun --container-image ubuntu:20.04 --container-name=sshd true",
        "PYXIS_CONTAINER_IMAGE=ubuntu:22.04 run_srun true",
        "run_srun --container-image=docker.io#ubuntu:24.04 true",
        "run_srun --container-image=docker.io/ubuntu:24.04 true",
        "NVIDIA_VISIBLE_DEVICES=all run_srun --container-image=ubuntu nvidia-smi",
    ):
        text, counts = _rw("env.bats", f"    {before}\n")
        assert IMG in text and "ubuntu" not in text.replace(IMG, ""), before
        assert counts == {"image": 1}
    text, _ = _rw("env.bats", "    run_srun --container-image=ubuntu:18.04 sh -c 'echo $FOO'\n")
    assert text == f"    run_srun --container-image={IMG} sh -c 'echo $FOO'\n"


def test_what_is_not_an_image_reference_is_left_alone() -> None:
    for line in (
        "    run_srun --container-image=./ubuntu.sqsh grep 'Ubuntu 24.04' /etc/os-release\n",
        '    name="mpi4py_ubuntu2004"\n',
        "    install_deps_ubuntu ${name}\n",
        "    run_srun --container-image=nvidia/cuda:11.8.0-base-ubuntu22.04 true\n",
        '    readonly image="./ubuntu-modified.sqsh"\n',
        '@test "Docker Hub ubuntu:24.04" {\n',  # test names stay as upstream wrote them (TABLE, --filter)
        '@test "mpi4py: ubuntu:20.04" {\n',
    ):
        assert _rw("docker_image.bats", line) == (line, {}), line


def test_docker_import_becomes_a_copy_of_the_local_image() -> None:
    text, counts = _rw("squashfs_image.bats", "    run_enroot import -o ubuntu.sqsh docker://ubuntu:24.04\n")
    assert text == f"    cp -f {IMG} ubuntu.sqsh\n"
    assert counts == {"import": 1}
    # only where the table of rewrites expects it
    line = "    run_enroot import -o ubuntu.sqsh docker://ubuntu:24.04\n"
    assert "docker://" in _rw("exec.bats", line)[0]


def test_host_probes_move_to_the_node_but_not_the_commands_in_the_container() -> None:
    src = (
        "    host_netns=$(readlink /proc/self/ns/net)\n"
        "    run_srun --container-unshare=net,ipc,uts --container-image=ubuntu:24.04 \\\n"
        '        bash -c \'echo "net=$(readlink /proc/self/ns/net)"; \\\n'
        '                 echo "ipc=$(readlink /proc/self/ns/ipc)"\'\n'
        '    host_dev_dev="$(stat -c %d /dev)"\n'
        "    before=$(ipcs -m)\n"
        '    [ "$(hostname)" == "${host_hostname}" ]\n'
    )
    text, counts = _rw("unshare_uts.bats", src)
    out = text.splitlines()
    assert out[0] == "    host_netns=$(srun -N1 --overlap readlink /proc/self/ns/net)"
    assert out[2] == '        bash -c \'echo "net=$(readlink /proc/self/ns/net)"; \\'  # inside the container
    assert out[3] == '                 echo "ipc=$(readlink /proc/self/ns/ipc)"\''
    assert out[4] == '    host_dev_dev="$(srun -N1 --overlap stat -c %d /dev)"'
    assert out[5] == "    before=$(srun -N1 --overlap ipcs -m)"
    assert out[6] == '    [ "$(srun -N1 --overlap hostname)" == "${host_hostname}" ]'
    assert counts == {"image": 1, "host-probe": 3, "host-probe-inline": 1}
    # files the rule is not meant for keep their probes
    assert _rw("env.bats", "    host_netns=$(readlink /proc/self/ns/net)\n")[1] == {}


def test_job_step_lines_and_shared_tmp() -> None:
    text, _ = _rw("name.bats", '    job_id="${lines[2]}"\n    step_id="${lines[3]}"\n')
    assert text == '    job_id="${lines[-2]}"\n    step_id="${lines[-1]}"\n'
    text, _ = _rw("mounts.bats", '    mkdir -p "/tmp/pyxis test dir"\n')
    assert text == '    mkdir -p "${PWD}/pyxis test dir"\n'


def test_a_changed_upstream_test_stops_the_rewrite() -> None:
    msg = r"rewrite 'import' replaced 8 times in squashfs_image\.bats, expected 9"
    with pytest.raises(rb.HarnessError, match=msg):
        rb.check_counts("squashfs_image.bats", {"import": 8})


def test_leftover_registry_images_are_found() -> None:
    assert rb.leftover_images("run_srun --container-image=nginx:1.19.1 nginx -v") == [
        "--container-image=nginx:1.19.1"
    ]
    assert rb.leftover_images("run_enroot import -o x.sqsh docker://ubuntu:24.04") == [
        "docker://ubuntu:24.04"
    ]
    ok = f"run_srun --container-image={IMG} true; run_srun --container-image=./x.sqsh true; "
    ok += 'run_srun --container-image="${image}" true; run_srun --container-image= true; '
    ok += "run_srun --container-image=thisimagedoesntexist true"
    assert rb.leftover_images(ok) == []


def test_every_upstream_test_is_classified_exactly_once(prepared: object) -> None:
    sel = prepared.selection  # type: ignore[attr-defined]
    assert len(sel) == len(rb.TABLE) == 187
    assert len({(t.file, t.name) for t, _ in sel}) == 187
    assert {(r.file, r.name) for _, r in sel} == {(r.file, r.name) for r in rb.TABLE}
    run = [r for _, r in sel if r.users]
    assert len(run) == 126
    assert all(r.reason for _, r in sel if not r.users)  # every skip says why
    assert all(set(r.users) <= {"root", rb.USER} for r in rb.TABLE)
    # no selected test still needs a registry, and every srun is bounded
    for t, row in sel:
        if row.users:
            assert rb.leftover_images(prepared.rewritten[(t.file, t.name)].body) == []  # type: ignore[attr-defined]
    common = (prepared.tests_dir / "common.bash").read_text()  # type: ignore[attr-defined]
    assert common.endswith(rb.SRUN_WRAPPER)
    assert subprocess.run(["bash", "-n", "-c", common], check=False).returncode == 0


def test_a_test_missing_from_the_table_fails_loudly(prepared: object, tmp_path: Path) -> None:
    tests = tmp_path / "tests"
    shutil.copytree(prepared.tests_dir, tests)  # type: ignore[attr-defined]
    with (tests / "writable.bats").open("a") as fh:
        fh.write('\n@test "a brand new upstream test" {\n    true\n}\n')
    with pytest.raises(rb.HarnessError, match=r"not in the harness' TABLE.*writable.bats:\d+: a brand new"):
        rb.classify(rb.discover(tests))
    (tests / "path.bats").unlink()
    with pytest.raises(rb.HarnessError, match=r"no such test in the tarball: path.bats: redis-server"):
        rb.classify(rb.discover(tests))


def test_a_duplicate_table_row_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rb, "TABLE", (*rb.TABLE, rb.TABLE[0]))
    msg = r"more than once: concurrency\.bats: concurrent container creation"
    with pytest.raises(rb.HarnessError, match=msg):
        rb.table_index()


def test_the_tarball_must_match_the_lock(tmp_path: Path) -> None:
    lock = copy.deepcopy(rb.load_lock())
    art = lock["artifacts"]["pyxis"]
    (tmp_path / art["filename"]).write_bytes(b"not the pinned tarball")
    with pytest.raises(rb.HarnessError, match=r"lcm_lock\.artifacts\.pyxis\.sha256"):
        rb.pyxis_tarball(lock, tmp_path)
    with pytest.raises(rb.HarnessError, match="not found"):
        rb.pyxis_tarball(lock, tmp_path / "nowhere")


def test_bats_is_pinned() -> None:
    assert rb.load_lock()["packages"]["bats"] == "1.8.2-1"


def test_names_and_filter_match_as_bats_does() -> None:
    assert rb.display_name(r"\$TERM special case") == "$TERM special case"
    raws = [r"\$TERM special case", "--container-workdir target doesn't exist", "--container-mounts tmpfs"]
    regex = rb.filter_regex(raws)
    names = [*raws, "--container-mounts tmpfs huge pages", "$TERM special case", "--container-mounts"]
    script = 'for n in "${@:2}"; do if [[ "$n" =~ $1 ]]; then echo y; else echo n; fi; done'
    argv = ["bash", "-c", script, "_", regex, *names]
    out = subprocess.run(argv, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["y", "y", "y", "n", "n", "n"]


def test_tap_parsing() -> None:
    tap = "\n".join(
        [
            "1..4",
            "ok 1 --container-mounts tmpfs in 1325ms",
            "not ok 2 --container-mounts umount in 2780ms",
            "# (in test file tests/mounts.bats, line 117)",
            "# slurmstepd-lab-node2: error: pyxis: container start failed with error code: 1",
            "ok 3 --container-mounts /etc/shadow # skip test requires non-root",
            "ok 4 legacy formatter line # in 12 ms",
        ]
    )
    got = [(r.name, r.status, r.ms, r.skip_reason) for r in rb.parse_tap(tap)]
    assert got == [
        ("--container-mounts tmpfs", "passed", 1325, ""),
        ("--container-mounts umount", "failed", 2780, ""),
        ("--container-mounts /etc/shadow", "skipped", None, "test requires non-root"),
        ("legacy formatter line", "passed", 12, ""),
    ]
    assert rb.parse_tap(tap)[1].output[1].endswith("container start failed with error code: 1")


def test_jobs_spread_over_the_lanes(prepared: object) -> None:
    jobs = rb.plan_jobs(prepared, 2)
    assert {j.lane for j in jobs} == {0, 1}
    assert sum(len(j.tests) for j in jobs) == sum(len(r.users) for r in rb.TABLE)
    user_job = next(j for j in jobs if j.user == rb.USER)
    argv = rb.job_argv(user_job, "lab-node2")
    assert argv[:4] == ["runuser", "-u", rb.USER, "--"] and f"HOME={rb.USER_HOME}" in argv
    assert argv[argv.index("-w") + 1] == "lab-node2" and "--exclusive" in argv
