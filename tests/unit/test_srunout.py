"""lcm_runner.launch.srunout: the per-node JSON answers of one multi-task `srun --label` step, whole
again although srun cut them into 1 KB pieces and interleaved the nodes' pieces."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from srunlabel import labelled

from lcm_runner.launch import srunout

FIXTURE = Path(__file__).parent / "fixtures" / "srun" / "label-2tasks-lab.txt"


def _answer(node: str, n: int) -> dict:
    return {
        "ts": 1.5,
        "node": node,
        "procs": [{"pid": i, "comm": "lcm-trainer", "cmdline": "x" * 200} for i in range(n)],
    }


def test_real_lab_output_two_nodes_with_a_warning_line() -> None:
    """Captured on the lab: two nodes, a 2.9 KB answer each after a warning line, in 1 KB pieces."""
    out = FIXTURE.read_text()
    assert any(len(ln) > 1000 for ln in out.splitlines())  # the answers really were cut
    with pytest.raises(json.JSONDecodeError):  # what the old parser did with such a line
        json.loads(next(ln.split(": ", 1)[1] for ln in out.splitlines() if '{"node"' in ln))
    got = srunout.answers(out)
    assert sorted(a["node"] for a in got) == ["lab-node1", "lab-node2"]
    assert all(len(a["procs"]) == 12 for a in got)


@pytest.mark.parametrize("tasks", [1, 2, 3, 12])
@pytest.mark.parametrize("piece", [7, 64, 1024])
def test_interleaved_pieces_of_any_size_come_back_whole(tasks: int, piece: int) -> None:
    want = [_answer(f"n{t}", 3 + t) for t in range(tasks)]
    out = labelled([f"warning: {t}\n" + json.dumps(a) + "\n" for t, a in enumerate(want)], piece=piece)
    assert srunout.answers(out) == want


def test_a_task_that_printed_no_answer_is_missing_not_invented() -> None:
    out = labelled([json.dumps(_answer("n0", 2)) + "\n", "Traceback (most recent call last): ...\n"])
    assert srunout.answers(out) == [_answer("n0", 2)]


def test_unlabelled_srun_messages_are_ignored() -> None:
    out = "srun: error: lab-node2: task 1: Exited with exit code 1\n" + labelled([json.dumps({"a": 1})])
    assert srunout.answers(out) == [{"a": 1}]


def test_the_last_answer_of_a_task_wins() -> None:
    out = labelled([json.dumps({"a": 1}) + "\n" + json.dumps({"a": 2}) + "\n"], piece=5)
    assert srunout.answers(out) == [{"a": 2}]
