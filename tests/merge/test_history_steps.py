"""A history far behind catches up in steps of bounded size, each its own commit."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from airflow_pglogrepl.exceptions import LakeError
from airflow_pglogrepl.lake import delta
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.merge import history, history_steps
from airflow_pglogrepl.merge.history import history_position, merge_history
from airflow_pglogrepl.merge.history_changes import TableChanges
from airflow_pglogrepl.merge.history_steps import steps
from tests.support.history_lake import NAME, T, commit_windows, commits, history_rows
from tests.support.history_model import model, ordered, random_changes

STEP_BYTES = 2048  # a few dozen changes of the model's table


def test_steps_end_at_a_transactions_commit_and_keep_it_whole(tmp_path: Path) -> None:
    rng = random.Random(3)
    changes = random_changes(rng, keyed=True, full=False, transactions=200)
    lake = Lake(str(tmp_path / "lake"), "s")
    end = commit_windows(lake, changes, [], keyed=True, full=False)[-1]
    table = TableChanges(delta.open_table(lake.paths.changes(T)))
    assert steps(table, None, int(end)) == [int(end)]  # (far below BATCH_BYTES)
    ends = steps(table, None, int(end), STEP_BYTES)
    assert len(ends) > 3 and ends == sorted(set(ends)) and ends[-1] == int(end)
    commits_at = {c["_commit_lsn"] for c in changes}
    assert set(ends[:-1]) <= commits_at  # each step ends where a transaction begins
    later = steps(table, ends[1], int(end), STEP_BYTES)
    assert later[-1] == int(end) and min(later) > ends[1]


def test_one_transaction_bigger_than_a_step_is_one_step(tmp_path: Path) -> None:
    from tests.support.history_model import change

    big = [change("I", 0x2000, seq, seq, seq) for seq in range(300)]
    after = [change("U", 0x2040, 0, 1, 7), change("U", 0x2080, 0, 2, 7)]
    lake = Lake(str(tmp_path / "lake"), "s")
    end = commit_windows(lake, [*big, *after], [], keyed=True, full=False)[-1]
    table = TableChanges(delta.open_table(lake.paths.changes(T)))
    ends = steps(table, None, int(end), STEP_BYTES)
    assert ends[0] == 0x2040 and ends[-1] == int(end)  # the transaction's 300 changes at once


@pytest.mark.parametrize(("keyed", "full"), [(True, False), (False, True), (False, False)],
                         ids=["keyed", "full", "no_identity"])  # fmt: skip
@pytest.mark.parametrize("seed", range(4))
def test_a_history_caught_up_in_steps_is_the_models(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keyed: bool, full: bool, seed: int
) -> None:
    rng = random.Random(seed)
    changes = random_changes(rng, keyed=keyed, full=full, transactions=150)
    if not keyed and not full:  # (a table without identity gets inserts and truncates)
        changes = [c for c in changes if c["_op"] in ("I", "T")]
    lake = Lake(str(tmp_path / "lake"), "s")
    cuts = sorted(rng.sample(sorted({c["_commit_lsn"] for c in changes}), 2))
    end = commit_windows(lake, changes, cuts, keyed=keyed, full=full)[-1]
    monkeypatch.setattr(history_steps, "BATCH_BYTES", STEP_BYTES)
    merge_history(lake, [NAME])
    assert history_position(lake, NAME) == end
    expected = model(changes, keyed=keyed, full=full)
    assert ordered(history_rows(lake)) == ordered(expected)
    positions = [c.get("pglogrepl.state_version") for c in commits(lake)]
    assert len(positions) > 3  # (one commit a step)


def test_a_run_that_fails_between_steps_leaves_a_step_the_next_run_goes_on_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(11)
    changes = random_changes(rng, keyed=True, full=False, transactions=150)
    lake = Lake(str(tmp_path / "lake"), "s")
    end = commit_windows(lake, changes, [], keyed=True, full=False)[-1]
    monkeypatch.setattr(history_steps, "BATCH_BYTES", STEP_BYTES)
    passed = []

    def crash(point: str) -> None:
        passed.append(point)
        if passed.count("history_committed") == 2:
            raise RuntimeError("killed after the second step's commit")

    monkeypatch.setattr(history, "fault", crash)
    with pytest.raises(LakeError, match="killed after the second step"):
        merge_history(lake, [NAME])
    stopped = history_position(lake, NAME)
    assert stopped is not None and stopped < end
    assert int(stopped) in {c["_commit_lsn"] for c in changes}
    at_stop = [c for c in changes if c["_commit_lsn"] < int(stopped)]  # exactly those below it
    assert ordered(history_rows(lake)) == ordered(model(at_stop, keyed=True, full=False))
    monkeypatch.setattr(history, "fault", lambda point: None)
    assert merge_history(lake, [NAME]) == {NAME: str(end)}
    assert ordered(history_rows(lake)) == ordered(model(changes, keyed=True, full=False))


def test_steps_follow_each_transactions_bytes_not_the_average(tmp_path: Path) -> None:
    """Many small changes, then a few of 20 kB of text a dictionary cannot shrink: sized by
    the range's average, their steps held ten times the limit."""
    import string

    from tests.support.history_model import change

    rng = random.Random(4)
    small = [change("I", 0x2000 + 0x10 * i, 0, i, i) for i in range(3000)]
    big = [change("U", 0x40000 + 0x10 * i, 0, i, -i,
                  "".join(rng.choices(string.ascii_letters, k=20_000)))
           for i in range(300)]  # fmt: skip
    lake = Lake(str(tmp_path / "lake"), "s")
    end = commit_windows(lake, [*small, *big], [0x40000], keyed=True, full=False)[-1]
    table = TableChanges(delta.open_table(lake.paths.changes(T)))
    limit = 1 << 20
    ends = steps(table, None, int(end), limit)
    held = [table.read(low, high).nbytes for low, high in zip([None, *ends], ends, strict=False)]
    assert max(held) <= 1.3 * limit, held  # (no transaction here is bigger than a step)
    assert len(ends) >= 6000 * 1000 // limit  # (the 20 kB rows alone are 6 MB)
